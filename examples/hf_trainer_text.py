"""A plain Hugging Face Trainer script, ported to bno-hvd: a small GPT-2 built from its config, on text.

Written in the shape of transformers' causal language modelling example (``run_clm.py``), not
copied from it: a model built from a config (no weights are downloaded), ``TrainingArguments``, a
collator that pads each batch to its longest sequence (labels -100 where padded; the model shifts
them), ``Trainer(...).train()`` and ``trainer.evaluate()``. Every line of the port ends in a
"# bno-hvd:" comment that says what the plain line was ("was <line>") or that it is new ("added");
putting those lines back gives the plain script, which tests/library/test_hf_trainer.py builds and
runs. The port splits each global batch of sequences by their tokens and weights each process by
its share of the global batch's tokens. The line marked "# offline" reads the project's built-in
corpus (Debian's fortunes, tokenized here; nothing is downloaded) or --data-dir. On CPUs (Gloo):

    torchrun --nproc-per-node 4 examples/hf_trainer_text.py --cpu --max-steps 50
"""

import argparse
import math

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import bno_hvd as bno  # bno-hvd: added
from bno_hvd.data import load_text_datasets  # offline

IGNORE = -100  # the label of a padded position: no loss


def parse_args():
    parser = argparse.ArgumentParser(description="Train a small GPT-2 on text with the Hugging Face Trainer")
    parser.add_argument("--batch-size", type=int, default=8, help="training sequences per process and step [8]")
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps [200]")
    parser.add_argument("--lr", type=float, default=0.003, help="AdamW's learning rate [0.003]")
    parser.add_argument("--max-seq-len", type=int, default=128, help="longest sequence; longer documents are cut")
    parser.add_argument("--vocab-size", type=int, default=2048, help="entries of the BPE vocabulary [2048]")
    parser.add_argument("--seed", type=int, default=42, help="seeds the initial weights and the order [42]")
    parser.add_argument("--log-steps", type=int, default=10, help="steps between two loss lines [10]")
    parser.add_argument("--output-dir", default="hf-trainer-out", help="the Trainer's folder [hf-trainer-out]")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (Gloo) even where GPUs are")
    parser.add_argument("--data-dir", help="a folder of .txt/.jsonl documents [the built-in corpus]")
    parser.add_argument("--strategy", default="balanced", help="how bno-hvd splits each global batch")  # bno-hvd: added
    parser.add_argument("--rebalance-every", type=int, default=10, help="updates between two splits")  # bno-hvd: added
    return parser.parse_args()


def collate(sequences):
    """``input_ids`` right-padded to the longest sequence, its ``attention_mask``, and ``labels``:
    the ids again, -100 where padded (the model shifts them by one to predict the next token)."""
    input_ids = pad_sequence(sequences, batch_first=True)
    attention_mask = pad_sequence([torch.ones_like(s) for s in sequences], batch_first=True)
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def build_model(vocab_size, max_seq_len):
    """A 2-layer GPT-2, 64 wide, from its config (random initial weights, no dropout)."""
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_seq_len + 1,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def test(trainer: Trainer):
    """Perplexity on the held-out split (the Trainer's evaluation: every process scores its part)."""
    loss = trainer.evaluate()["eval_loss"]
    if trainer.is_world_process_zero():
        print(f"test set: perplexity {math.exp(loss):.2f} (loss {loss:.4f})", flush=True)


def main():
    args = parse_args()
    torch.manual_seed(args.seed)  # the same initial weights in every process (DDP also sends process 0's)
    torch.set_num_threads(1)  # one thread per process: the processes of a host share its cores
    data = load_text_datasets(args.data_dir, max_seq_len=args.max_seq_len, vocab_size=args.vocab_size)  # offline
    model = build_model(data.vocab_size, args.max_seq_len)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=32,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        seed=args.seed,
        use_cpu=args.cpu,
        logging_steps=args.log_steps,
        save_strategy="no",
        report_to="none",
        remove_unused_columns=False,
    )
    trainer = bno.hf.BalancedTrainer(  # bno-hvd: was trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=data.test,
        data_collator=collate,
        strategy=args.strategy,  # bno-hvd: added
        rebalance_every=args.rebalance_every,  # bno-hvd: added
    )
    trainer.train()
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():
        print(
            f"test set: perplexity {math.exp(metrics['eval_loss']):.2f} (loss {metrics['eval_loss']:.4f})", flush=True
        )


if __name__ == "__main__":
    main()
