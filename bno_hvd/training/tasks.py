"""What is learned: image classification or next-token prediction. One object per kind of data
says how its batches reach the model, what the loss is, and how the test split is scored, so the
loop in :mod:`bno_hvd.training.loop` reads the same for both.

- :class:`ImageTask`: ``(images, labels)`` batches, cross entropy, test accuracy.
- :class:`TextTask`: padded token batches ``(tokens, lengths)`` (:mod:`bno_hvd.data.tokens`),
  cross entropy over every real token, test perplexity. Each rank's loss is its mean over its
  tokens and its weight its share of the global batch's tokens, so Horovod's ``op=Sum`` gives the
  mean over every token of the global batch: the single-process loss on that batch.

Usage (what :func:`bno_hvd.training.components.prepare` does)::

    task = make_task(cfg)
    data, notes = task.load(cfg)
    model = task.build_model(cfg, data)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bno_hvd.common.errors import UsageError
from bno_hvd.data.images import Datasets, load_datasets
from bno_hvd.data.models import build_model
from bno_hvd.training.evaluation import evaluate, evaluate_text


@dataclass
class Score:
    """The test split's score at one point of a run: what it stores and prints."""

    fields: dict  # result.json: test_accuracy/test_correct/test_total, or test_perplexity/test_loss/test_tokens
    point: dict  # one entry of --eval-every's list (with update, samples, time)
    line: str  # printed by rank 0 at the end: "test accuracy: ..." or "test perplexity: ..."


class ImageTask:
    kind = "images"
    collate = None  # the DataLoader's default

    def load(self, cfg) -> tuple[Datasets, list[str]]:
        data = load_datasets(
            cfg.dataset,
            cfg.data_dir,
            with_test=cfg.eval,
            image_size=cfg.image_size,
            synthetic_size=cfg.synthetic_size,
            seed=cfg.seed,
        )
        return data, []

    def build_model(self, cfg, data: Datasets):
        return build_model(cfg.model, cfg.num_classes or data.num_classes, data.input_shape)

    def strategy_units(self, cfg, data, size: int) -> tuple[int, int | None]:
        """What the strategy splits: ``(per-rank base, global batch)`` in samples."""
        return cfg.base_batch_size, cfg.global_batch

    def allocation(self, cfg, comm, model, data, size: int) -> tuple[dict, dict | None]:
        """The Balancer's :class:`~bno_hvd.library.step.TextOptions` fields for this data (none for images),
        and what run.json keeps of them."""
        return {}, None

    def parts(self, step, data, device, dtype):
        """``(inputs, targets, share)`` per micro-batch of this rank's batch."""
        x, y = data
        x, y = x.to(device, dtype, non_blocking=True), y.to(device, non_blocking=True)
        for part, share in step.parts():
            yield x[part], y[part], share

    def loss(self, model, inputs, targets):
        return F.cross_entropy(model(inputs), targets)

    def score(self, run) -> Score:
        w = run.world
        correct, total = evaluate(
            w.hvd, run.model, run.data.test, w.rank, w.size, run.cfg.eval_batch_size, num_workers=run.cfg.num_workers
        )
        line = f"test accuracy: {correct / total:.4f} ({correct}/{total})"
        fields = {"test_accuracy": correct / total, "test_correct": correct, "test_total": total}
        return Score(fields, {"accuracy": correct / total}, line)


class TextTask:
    kind = "text"

    @staticmethod
    def collate(samples):
        from bno_hvd.data.tokens import collate_tokens

        return collate_tokens(samples)

    def load(self, cfg) -> tuple[Datasets, list[str]]:
        from bno_hvd.data.tokens import load_text_datasets

        text = load_text_datasets(
            cfg.data_dir, max_seq_len=cfg.max_seq_len, vocab_size=cfg.vocab_size, with_test=cfg.eval
        )
        return Datasets(text.train, text.test, (cfg.max_seq_len,), text.vocab_size), text.notes

    def build_model(self, cfg, data: Datasets):
        from bno_hvd.data.gpt import build_text_model

        return build_text_model(cfg.model, data.num_classes, cfg.max_seq_len)

    def strategy_units(self, cfg, data, size: int) -> tuple[int, int | None]:
        """Samples, or shares of work: ``UNITS`` per average sequence (:mod:`bno_hvd.allocation.costmodel`)."""
        if cfg.allocation_unit == "samples":
            return cfg.base_batch_size, cfg.global_batch
        from bno_hvd.allocation.costmodel import UNITS

        sequences = cfg.global_batch or size * cfg.base_batch_size
        if cfg.global_tokens is not None:  # the work of a typical global batch of that many tokens
            sequences = max(size, round(cfg.global_tokens / float(data.train.lengths.mean())))
        return max(1, round(UNITS * sequences / size)), UNITS * sequences

    def allocation(self, cfg, comm, model, data, size: int) -> tuple[dict, dict | None]:
        """Lengths (token weights), and the work of each sequence when the split or an emulation needs it."""
        from bno_hvd.allocation.costmodel import TOKENS, fit_warning, work_per_sequence
        from bno_hvd.training.calibrate import calibrate, describe

        lengths = data.train.lengths
        unit = cfg.allocation_unit
        split = {"lengths": lengths}
        if unit != "samples":
            split.update(shares=True, global_count=cfg.global_batch or size * cfg.base_batch_size)
            split["global_tokens"] = cfg.global_tokens
        if unit == "tokens":
            split.update(work=work_per_sequence(lengths, TOKENS), cost=TOKENS)
        if unit != "cost" and not cfg.emulated:
            return split, ({"unit": unit} if unit == "tokens" else None)
        measured = calibrate(comm, model, data.num_classes, cfg.max_seq_len)
        if comm.Get_rank() == 0:
            import sys

            print(f"bno-hvd: note: {describe(measured)}", file=sys.stderr, flush=True)
            warning = fit_warning(measured["sweep"], measured["errors"])
            if warning:
                print(f"bno-hvd: note: {warning}", file=sys.stderr, flush=True)
        kept = {**measured, "cost": measured["cost"].to_dict(), "unit": unit}
        measured_work = work_per_sequence(lengths, measured["cost"])
        if unit == "cost":
            split.update(work=measured_work, cost=measured["cost"])
        if cfg.emulated:  # EMULATED devices take as long as the measured cost of their sequences, whatever the split
            split["emulated_work"] = measured_work
        return split, kept

    def parts(self, step, data, device, dtype):
        """``((tokens, lengths), targets, share)`` per micro-batch, each padded to its own longest sequence."""
        from bno_hvd.data.tokens import inputs_and_targets

        tokens, lengths = data
        if not torch.equal(lengths, torch.as_tensor(step.lengths)):  # the loader and the balancer agree
            raise RuntimeError(f"update {step.update}: the batch's sequences are not those the balancer allocated")
        for part, share in step.parts():
            part_lengths = lengths[part]
            width = int(part_lengths.max()) + 1
            inputs, targets = inputs_and_targets(tokens[part, :width], part_lengths)
            yield (inputs.to(device, non_blocking=True), part_lengths.to(device)), targets.to(device), share

    def loss(self, model, inputs, targets):
        from bno_hvd.data.tokens import IGNORE

        logits = model(*inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)

    def score(self, run) -> Score:
        w = run.world
        loss_sum, tokens = evaluate_text(
            w.hvd, run.model, run.data.test, w.rank, w.size, max(4096, run.cfg.max_seq_len)
        )
        loss = loss_sum / tokens
        perplexity = math.exp(min(loss, 700.0))
        line = f"test perplexity: {perplexity:.2f} (loss {loss:.4f} nats/token over {tokens} held-out tokens)"
        fields = {"test_perplexity": perplexity, "test_loss": loss, "test_tokens": tokens}
        return Score(fields, {"perplexity": perplexity, "loss": loss}, line)


def make_task(cfg):
    """The task of ``cfg.dataset``; refuses a model of the other kind."""
    from bno_hvd.data.catalog import TEXT_MODEL_NAMES

    if cfg.dataset == "text":
        return TextTask()
    if cfg.model in TEXT_MODEL_NAMES:
        raise UsageError(f"--model {cfg.model} is a language model: use it with --dataset text")
    return ImageTask()
