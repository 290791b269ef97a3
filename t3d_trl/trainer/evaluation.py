"""The trainer's own metrics and its evaluation: what ``evaluate`` and ``predict`` share.

Loss terms, DDO log-ratios, masked-token accuracy and entropy are recorded as sums and counts (of masked tokens,
or of rows for DDO's terms) over every micro-batch and process, and logged with the trainer's logs as total sum /
total count, so a metric weighs every token alike whatever the batch size or number of processes (the rows
accelerate repeats to even out an evaluation's last batch over processes are left out). Evaluation draws every
state as in epoch 0, so evaluations are comparable across training, and a dataset passed to ``evaluate`` or
``predict`` is checked and prepared as the training set is.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import datasets
import torch


class MetricsMixin:
    """Mixed into :class:`~t3d_trl.trainer.T3DTrainer` before transformers' ``Trainer``."""

    _eval_prefix = "eval"  # metric_key_prefix of the evaluation running: ``log`` names its metrics so

    def _init_metrics(self) -> None:
        # mode -> metric -> [sum, count] since the last log
        self._metrics: dict[str, dict[str, list[float]]] = {
            "train": defaultdict(lambda: [0.0, 0.0]),
            "eval": defaultdict(lambda: [0.0, 0.0]),
        }

    def _record(self, metrics: dict[str, tuple[torch.Tensor, torch.Tensor]], mode: str | None = None) -> None:
        """Add this micro-batch's ``(sum, count)`` of each metric, summed over processes (one gather). A NaN sum (a
        diverged model) stays NaN: an empty batch sums to 0, so a NaN is never a stand-in for "nothing counted"."""
        mode = mode or ("train" if self.model.training else "eval")
        names = sorted(metrics)
        values = torch.stack(
            [
                torch.stack([total.detach().float(), count.detach().float()])
                for total, count in (metrics[n] for n in names)
            ]
        )
        values = self.accelerator.gather(values.unsqueeze(0)).sum(0)
        for name, (total, count) in zip(names, values.tolist()):
            recorded = self._metrics[mode][name]
            recorded[0] += total
            recorded[1] += count

    def _mean_metrics(self, mode: str) -> dict[str, float]:
        """The recorded metrics of ``mode`` (total sum / total count; cleared). A metric that counted nothing since
        the last log (no DDO state in any row) is left out."""
        metrics = {k: total / count for k, (total, count) in self._metrics[mode].items() if count}
        self._metrics[mode].clear()
        return metrics

    def _eval_metrics(self, prefix: str) -> dict[str, float]:
        """The recorded evaluation metrics, named ``<prefix>_<name>``, with ``<prefix>_loss``: the objective over
        the whole set at once (each term's mean over all its tokens or rows, weighted as ``compute_loss`` weighs
        them). transformers' own ``eval_loss`` averages per-batch losses, which depends on the eval batch size."""
        means = self._mean_metrics("eval")
        args = self.args
        weights = {
            "t3d": {"loss/ddo": 1.0, "loss/path": args.lambda_path},
            "dparallel": {"loss/ce": 1.0, "loss/certainty": 1.0},
        }.get(args.loss_type, {f"loss/{args.loss_type}": 1.0})
        metrics = {f"{prefix}_{name}": value for name, value in means.items()}
        if means:  # a term that counted nothing (no DDO state in any row) adds 0, as in compute_loss
            metrics[f"{prefix}_loss"] = sum(w * means.get(name, 0.0) for name, w in weights.items())
        return metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training:
            logs.update(self._mean_metrics("train"))
        else:  # in place: evaluate returns the dict it logs
            logs.update(self._eval_metrics(self._eval_prefix))
        super().log(logs, start_time)

    @contextlib.contextmanager
    def _evaluation(self, dataset: Any, prefix: str) -> Iterator[Any]:
        """What ``evaluate`` and ``predict`` share: a dataset passed to them is checked and prepared as the
        training set is; states are drawn as in epoch 0 every time, so evaluations are comparable across
        training; metrics are named with ``prefix``."""
        if isinstance(dataset, datasets.Dataset):
            with self.args.main_process_first(desc="dataset preparation"):
                dataset = self._prepare_eval_dataset(dataset, self.args, self.processing_class, prefix)
        collator, previous, self._eval_prefix = self.data_collator, self._eval_prefix, prefix
        epoch = getattr(collator, "epoch", None)
        if epoch is not None:
            collator.epoch = 0
        try:
            yield dataset
        finally:
            self._eval_prefix = previous  # a dict of eval sets nests one evaluate per set
            if epoch is not None:
                collator.epoch = epoch

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        with self._evaluation(eval_dataset, metric_key_prefix) as dataset:
            return super().evaluate(dataset, ignore_keys, metric_key_prefix)

    def predict(
        self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> Any:
        with self._evaluation(test_dataset, metric_key_prefix) as dataset:
            output = super().predict(dataset, ignore_keys, metric_key_prefix)
        # predict logs nothing: its metrics go into its output, not into the next evaluation's log.
        output.metrics.update(self._eval_metrics(metric_key_prefix))
        return output

    def _without_repeated_rows(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``inputs`` with the rows accelerate repeated from the start of the set to even out the last batch over
        processes (``even_batches``) taken out of the loss and the metrics, as ``gather_for_metrics`` drops them:
        of the last round's batches, gathered in process order, only the first ``remainder`` rows are real."""
        accelerator, state = self.accelerator, self.accelerator.gradient_state
        if accelerator.num_processes == 1 or not accelerator.even_batches or not state.end_of_dataloader:
            return inputs
        if state.remainder <= 0:  # the set fills its last round (0), or has no length (-1)
            return inputs
        rows = inputs["loss_mask"].shape[0]
        first = accelerator.process_index * rows
        real = torch.arange(first, first + rows, device=inputs["loss_mask"].device) < state.remainder
        return {
            **inputs,
            "loss_mask": inputs["loss_mask"] & real[:, None],
            "target_mask": inputs["target_mask"] & real[:, None],
        }

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._without_repeated_rows(self._prepare_inputs(inputs))
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None
