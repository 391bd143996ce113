"""The Hugging Face ``Trainer`` (transformers 5.x): each global batch of sequences split by what
they cost, the loss weighted by tokens (docs/hf-trainer.md).

One line changes in a Trainer script (``examples/hf_trainer_text.py`` has the whole port)::

    trainer = bno.hf.BalancedTrainer(model=model, args=args, train_dataset=train_set, ...)  # was Trainer(...)

:class:`BalancedTrainer` is the ``Trainer`` with three of its parts taken by the drop-ins:

- the training loader is :class:`bno_hvd.DataLoader` over a :class:`~bno_hvd.Balancer` built for
  the job (``Balancer.for_world(train_set, per_device_train_batch_size, lengths=, cost=)``): the
  global batch is N x ``per_device_train_batch_size`` sequences, split by their cost (tokens by
  default), rebalanced every ``rebalance_every`` updates;
- the model Accelerate wraps in torch's DDP gets the DDP drop-in's weighting hook
  (:func:`bno_hvd.library.ddp.balance_ddp`): it sums the ranks' gradients (a model that does not
  take ``num_items_in_batch``: each weighted by its share of the global batch's tokens);
- the loss is each rank's share of the global mean: ``num_items_in_batch`` is the global batch's
  count of predictions (the balancer's lengths, checked against each batch's labels; transformers'
  own count is one too many per sequence for a GPT-2, whose ``loss_type`` it does not know), the
  hook sums at weight 1, and every rank's backward runs at one process's scale (as float32 parts
  such as Llama's RMSNorm need); ``average_tokens_across_devices`` is turned off.

N ranks compute the update of one process on the same global batch, the mean loss over every
predicted token of it (tests/library/test_hf_trainer.py: 1.2e-12 with GPT-2, 1.7e-12 with Llama,
float64). Refused in one line: gradient accumulation, DeepSpeed, FSDP, a model with active dropout
(its masks over padded sequences depend on the rank's padding), a training set without its
sequences' lengths, and lengths that do not count a batch's predictions.
"""

from __future__ import annotations

try:
    import transformers
except ImportError as err:  # pragma: no cover - the extra is not installed
    from bno_hvd.library.frameworks import missing_extra

    missing_extra("bno.hf needs Hugging Face transformers", "hf", err)

import torch

from bno_hvd.common.errors import UsageError
from bno_hvd.library.balancer import Balancer
from bno_hvd.library.ddp import balance_ddp
from bno_hvd.library.dropin import DataLoader
from bno_hvd.library.frameworks import refused_alike
from bno_hvd.processes.world import one_line_errors

__all__ = ["BalancedTrainer"]

# Config fields of transformers' models that set a dropout not held by an nn.Dropout module (sdpa's dropout_p)
DROPOUTS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "dropout", "hidden_dropout")


class BalancedTrainer(transformers.Trainer):
    """``transformers.Trainer`` whose ranks take uneven, rebalanced shares of each global batch of
    sequences (split by their cost) and whose update is one process's on the whole global batch,
    weighted by tokens.

    Args:
        *args, **kwargs: the ``Trainer``'s (``model``, ``args``, ``train_dataset``,
            ``data_collator``, ...). ``args.per_device_train_batch_size`` is the average sequences
            per rank (the global batch is N times it); ``args.seed`` seeds the order.
        lengths: the predictions of each training sequence (its labels that are not -100, after
            the causal shift); None: ``train_dataset.lengths`` (``bno_hvd.data``'s token sequences).
        cost: how a sequence's work is counted when splitting: ``"tokens"``, or what
            :func:`bno_hvd.measure_sequence_cost` measured on the model.
        strategy: bno-hvd's strategy (``"balanced"``, ``"equal"``, ``"random"``, ...).
        rebalance_every: updates between two splits.

    Example::

        trainer = bno.hf.BalancedTrainer(
            model=GPT2LMHeadModel(config), args=TrainingArguments("out", use_cpu=True, max_steps=100),
            train_dataset=train_set, data_collator=collate, strategy="balanced",
        )
        trainer.train()                      # under torchrun --nproc-per-node 4
    """

    def __init__(self, *args, lengths=None, cost="tokens", strategy="balanced", rebalance_every=10, **kwargs):
        one_line_errors()
        super().__init__(*args, **kwargs)
        self.balance = {"lengths": lengths, "cost": cost, "strategy": strategy, "rebalance_every": rebalance_every}
        self.balancer: Balancer | None = None
        self.summed = False  # the loss is this process's share of the global mean (get_batch_samples)
        self.args.average_tokens_across_devices = False  # the count is the balancer's (module docstring)

    def get_train_dataloader(self):
        """The balancer's loader over ``train_dataset`` (built at the first call), with the
        ``data_collator`` and the Trainer's loading options."""
        if self.balancer is None:
            self.balancer = self._balancer()
        options = {"num_workers": self.args.dataloader_num_workers, "pin_memory": self.args.dataloader_pin_memory}
        return DataLoader(self.train_dataset, sampler=self.balancer, collate_fn=self.data_collator, **options)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The Trainer's next batch, its predictions checked against the balancer's lengths. A model
        that takes ``num_items_in_batch`` gets the global batch's predictions: its loss is this
        process's share of the global mean (every process's backward at one process's scale, as
        float32 parts such as Llama's RMSNorm need), summed by the hook at weight 1."""
        batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
        step = self.balancer.current_step if self.balancer is not None else None
        if not batches or step is None or "labels" not in batches[0]:
            return batches, count
        check_predictions(self, batches[0]["labels"], int(step.lengths.sum()))
        self.summed = count is not None
        if not self.summed:
            return batches, count  # the model's own mean over this process's predictions, weighted by the hook
        step.weight = 1.0
        return batches, torch.tensor(step.global_tokens, device=device)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """The Trainer's step; the loss it logs is the global batch's mean (the processes' mean of N x their share)."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        return loss * self.args.world_size if self.summed else loss

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        model, train_dataloader = super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not getattr(model, "_bno_weighted", 0):
            handler = self.accelerator.ddp_handler
            balance_ddp(model, self.balancer, handler.to_kwargs() if handler is not None else {})
            model._bno_weighted = True
        return model, train_dataloader

    def _balancer(self) -> Balancer:
        with refused_alike():
            refuse_unsupported(self)
            dataset, options = self.train_dataset, dict(self.balance)
            lengths = options.pop("lengths")
            lengths = getattr(dataset, "lengths", None) if lengths is None else lengths
            if lengths is None:
                raise UsageError(
                    "BalancedTrainer needs each training sequence's predictions: BalancedTrainer(..., "
                    "lengths=[...]) (its labels that are not -100, after the shift), or a train_dataset with .lengths"
                )
            check_first_sequences(self, dataset, lengths)
        strategy = options.pop("strategy")
        batch = self.args.per_device_train_batch_size
        # no process sits an update out: the Trainer's loop would count its steps apart (a split with a 0 is refused)
        options["sit_out"] = False
        return Balancer.for_world(dataset, batch, strategy, seed=self.args.seed, lengths=lengths, **options)


def check_predictions(trainer, labels, lengths: int) -> None:
    """This process's batch predicts as many tokens as its lengths say (transformers counts every
    label that is not -100 for a model whose ``loss_type`` it does not know, e.g. ``GPT2LMHeadModel``:
    one more per sequence than its shifted loss predicts, so its count is not used)."""
    predicted = int((labels[..., 1:] if shifts_labels(trainer.model) else labels).ne(-100).sum())
    if predicted != lengths:
        rank = trainer.args.process_index
        raise UsageError(miscount(f"process {rank}'s batch", predicted, lengths), rank=rank)


def check_first_sequences(trainer, dataset, lengths, count: int = 8) -> None:
    """The first ``count`` training sequences, collated, predict as many tokens as their lengths
    say: every process checks the same ones before training, so all refuse alike."""
    first = range(min(count, len(dataset)))
    labels = trainer.data_collator([dataset[i] for i in first]).get("labels")
    if labels is not None:
        predicted = int((labels[..., 1:] if shifts_labels(trainer.model) else labels).ne(-100).sum())
        if predicted != sum(int(lengths[i]) for i in first):
            raise UsageError(miscount(f"the first {len(first)} sequences", predicted, sum(lengths[i] for i in first)))


def miscount(what: str, predicted: int, lengths: int) -> str:
    return (
        f"{what}: {predicted} labels to predict, but the lengths say {lengths}: BalancedTrainer weights "
        "by lengths=, one per sequence: its labels that are not -100 after the shift"
    )


def shifts_labels(model) -> bool:
    """Whether the model's loss predicts label i+1 at position i (transformers' causal-LM loss,
    also where ``loss_type`` is unknown and ``loss_function`` falls back to it)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    model = getattr(model, "module", model)
    config = getattr(model, "config", None)
    return getattr(model, "loss_function", None) is ForCausalLMLoss and not getattr(config, "is_encoder_decoder", False)


def refuse_unsupported(trainer) -> None:
    """One line for each thing the balanced Trainer cannot do exactly (module docstring)."""
    if trainer.args.gradient_accumulation_steps != 1:
        raise UsageError(
            f"gradient_accumulation_steps={trainer.args.gradient_accumulation_steps}: BalancedTrainer does not "
            "accumulate gradients; raise per_device_train_batch_size (the average sequences per rank) instead"
        )
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise UsageError("BalancedTrainer trains with DDP: drop DeepSpeed/FSDP (the weighting is a DDP comm hook)")
    active = [name for name, m in trainer.model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    config = getattr(trainer.model, "config", None)
    active += [f"config.{k}" for k in DROPOUTS if isinstance(getattr(config, k, 0), float) and getattr(config, k) > 0]
    if active:
        raise UsageError(
            f"the model has active dropout ({active[0]}, {len(active)} in all): its masks over padded sequences "
            "depend on each rank's padding, so uneven batches would not be exact; set the config's dropout to 0"
        )
