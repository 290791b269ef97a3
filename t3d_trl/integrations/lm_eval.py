"""An lm-evaluation-harness model for diffusion LMs, registered under the name ``"t3d"``.

    import lm_eval
    import t3d_trl.integrations.lm_eval  # registers "t3d"

    lm_eval.simple_evaluate(
        model="t3d",
        model_args="pretrained=JetLM/SDAR-4B-Chat,dtype=bfloat16,block_length=4,tokens_per_step=2",
        tasks=["gsm8k"],
    )

or from a shell, with exactly ``lm_eval``'s arguments and output: ``t3d-trl lm-eval --model t3d ...``.

* ``generate_until`` decodes with ``diffusion_generate`` (through
  :func:`t3d_trl.evaluation.completions.generate_completions`, the code path of ``t3d-trl eval``). Every
  :class:`~t3d_trl.generation.DiffusionGenerationConfig` field is a model argument (``block_length``,
  ``tokens_per_step``, ``steps``, ``threshold``, ``remasking``, ``use_cache``, ``temperature``...); fields left out
  keep the settings saved with the model. The task's ``until`` strings cut the completion; its ``max_gen_toks`` is
  the generation length (rounded up to a whole number of blocks) unless ``max_new_tokens`` is a model argument.
  Contexts too long for the model's positions are cut from the left, as lm-eval's Hugging Face models do. NFE,
  tokens per second and tokens per step are logged and written to the results' ``config`` under ``t3d_decoding``,
  the settings decoded with under ``t3d_generation_config`` (see :meth:`DiffusionLM.get_model_info`).
* ``loglikelihood`` is a Monte Carlo estimate of the masked-diffusion ELBO of the continuation, as LLaDA's
  evaluation computes it. ``estimator="stratified"`` (default, LLaDA's form without its rounding bias): sample
  ``j`` of ``mc_num`` masks ``l_j = floor((j + u) L / mc_num) + 1`` of the continuation's ``L`` tokens (``u ~
  U[0, 1)``, so ``l`` covers ``1..L`` evenly), chosen uniformly, weighted by ``L / l_j``; the noise is drawn per
  request from ``(seed, request)``. ``estimator="random_t"``: each token masked with probability ``t ~ U(0, 1]``,
  weighted by ``1 / t``, the noise of sample ``j`` drawn from ``(seed, j)`` for every request. Block-causal models
  get the sum of per-block ELBOs (each block given the clean blocks before it), shifted-logit models read each
  token's prediction at the position before it. ``cfg`` guides the logits as LLaDA does. ``is_greedy`` is
  LLaDA's check: decoding a canvas of the continuation's length one most-confident token per step reproduces it.
* ``loglikelihood_rolling`` (perplexity tasks) is refused: a diffusion LM has no left-to-right likelihood to roll.
* Data parallel: launched with ``accelerate launch -m t3d_trl.cli.main lm-eval ...`` (or ``accelerate launch``
  of a script calling ``simple_evaluate``), each process takes its share of the requests, as lm-eval does for
  Hugging Face models.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
from collections import defaultdict
from dataclasses import fields
from typing import Any

import numpy as np
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from ..data.collator import DataCollatorForDiffusion, diffusion_attention_mask
from ..diffusion.forward import max_positions
from ..evaluation.completions import generate_completions, left_fitted
from ..evaluation.metrics import throughput
from ..evaluation.runner import load_model
from ..generation.configuration import OUTPUT_FIELDS, DiffusionGenerationConfig
from ..generation.guidance import guide_logits
from ..models.diffusion_config import DiffusionConfig
from ..models.forward import accepts_4d_mask, diffusion_forward, unwrap_model

logger = logging.getLogger(__name__)

__all__ = ["DiffusionLM"]

_GENERATION_FIELDS = {f.name for f in fields(DiffusionGenerationConfig)} - set(OUTPUT_FIELDS)
ESTIMATORS = ("stratified", "random_t")


def stratified_masks(
    groups: np.ndarray, mc_num: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified masks of one continuation: ``(masked [mc_num, L], mask_prob [mc_num, L])``.

    Each group (the whole continuation, or one block of a block-causal model) of ``n`` tokens draws its own offset
    ``u ~ U[0, 1)``; sample ``j`` masks ``l_j = floor((j + u) n / mc_num) + 1`` of its tokens, a uniformly drawn
    subset, with ``mask_prob = l_j / n`` (the weight ``n / l_j``). Every ``l`` in ``1..n`` is equally likely for
    each sample, so the mean is unbiased, and the counts are spread evenly over the samples (each ``l`` gets
    ``mc_num / n`` of them, rounded by the offset, never by rounding half to even as LLaDA's code does).
    """
    masked = np.zeros((mc_num, len(groups)), dtype=bool)
    prob = np.ones((mc_num, len(groups)))
    for group in np.unique(groups):
        cols = np.flatnonzero(groups == group)
        size = len(cols)
        counts = np.floor((np.arange(mc_num) + rng.random()) * size / mc_num).astype(np.int64) + 1
        ranks = rng.random((mc_num, size)).argsort(1).argsort(1)  # a uniform random order per sample
        masked[:, cols] = ranks < counts[:, None]
        prob[:, cols] = (counts / size)[:, None]
    return masked, prob


def _as_bool(value: Any) -> bool:
    """A model argument given as a bool or as text (``--model_args is_check_greedy=False``)."""
    if isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {value!r}")
        return value.lower() in ("true", "1")
    return bool(value)


def _attach_adapter(model: torch.nn.Module, peft: str) -> torch.nn.Module:
    """The ``peft`` adapter on ``model`` with the decoding defaults saved with it, as ``AutoModelForDiffusionLM``
    loads an adapter folder: a student decodes at the settings it was trained for, not its base model's (the
    model arguments still apply over them)."""
    from peft import PeftModel

    from ..diffusion.config import CONFIG_KEY as DIFFUSION_KEY
    from ..generation.configuration import CONFIG_KEY as GENERATION_KEY
    from ..models.auto import add_diffusion_generation, read_adapter_defaults
    from ..utils import without_checkpointing_deprecation

    saved = read_adapter_defaults(peft, {})
    with without_checkpointing_deprecation():  # peft reads a deprecated transformers attribute
        model = PeftModel.from_pretrained(model, peft).eval()
    return add_diffusion_generation(model, saved.get(DIFFUSION_KEY), saved.get(GENERATION_KEY))


@register_model("t3d")
class DiffusionLM(TemplateLM):
    """lm-eval model over a t3d-trl diffusion LM (any family ``AutoModelForDiffusionLM`` loads).

    Args:
        pretrained: checkpoint folder or Hub repo id, or an already loaded model (then pass ``tokenizer``).
        tokenizer: its tokenizer (a name/path, or an object); default: ``pretrained``'s.
        peft: a ``peft`` adapter folder or Hub id to load on top of ``pretrained`` (a LoRA student), with the
            decoding defaults saved with it.
        dtype: ``auto``, ``bfloat16``, ``float16`` or ``float32``.
        device: default ``cuda`` when available, else ``cpu``; under ``accelerate launch``, each process's device.
        batch_size: prompts per ``diffusion_generate`` call (``generate_until``); a number, not ``auto``.
        seed: seed of the sampling generator (``generate_until``) and of the Monte Carlo noise (``loglikelihood``).
        mc_num: Monte Carlo samples per ``loglikelihood`` request (LLaDA's evaluation uses 128).
        mc_batch_size: noisy copies per forward pass in ``loglikelihood`` (the estimate does not depend on it).
        estimator: ``stratified`` (default) or ``random_t``, the Monte Carlo estimator of ``loglikelihood`` (see
            the module docstring and docs/evaluation.md).
        cfg: classifier-free guidance scale (LLaDA's ``cfg``): the same as the generation setting ``cfg_scale``, it
            guides ``loglikelihood``, ``is_greedy`` and ``generate_until``. 0 (default): off.
        is_check_greedy: compute ``is_greedy`` (LLaDA's check, one decoding per request); ``False`` answers
            ``False`` without decoding, as LLaDA's scripts run.
        **generation_kwargs: ``DiffusionGenerationConfig`` fields (``block_length``, ``tokens_per_step``,
            ``threshold``...), over the settings saved with the model.
    """

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> DiffusionLM:
        """``--model_args`` plus the command line's own ``--batch_size`` and ``--device``, which lm-eval always
        passes: a value given in ``--model_args`` wins instead of colliding with them."""
        from lm_eval.utils import simple_parse_args_string

        args = simple_parse_args_string(arg_string)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in args}
        return cls(**args, **extra)

    def __init__(
        self,
        pretrained: str | torch.nn.Module,
        tokenizer: Any = None,
        peft: str | None = None,
        dtype: str = "auto",
        device: str | None = None,
        batch_size: int | str = 8,
        seed: int = 0,
        mc_num: int = 128,
        mc_batch_size: int = 32,
        estimator: str = "stratified",
        cfg: float | None = None,
        is_check_greedy: bool | str = True,
        **generation_kwargs: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(set(generation_kwargs) - _GENERATION_FIELDS)
        if unknown:  # bad input (a misspelt --model_args key): the command line reports it in one line
            raise ValueError(
                f"unknown t3d model argument(s) {unknown}; the model takes pretrained, tokenizer, peft, dtype, "
                "device, batch_size, seed, mc_num, mc_batch_size, estimator, cfg, is_check_greedy and the "
                f"generation settings {sorted(_GENERATION_FIELDS)}"
            )
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if cfg is not None:
            if "cfg_scale" in generation_kwargs and float(generation_kwargs["cfg_scale"]) != float(cfg):
                raise ValueError(
                    f"cfg={cfg} and cfg_scale={generation_kwargs['cfg_scale']} disagree; give one"
                )
            generation_kwargs["cfg_scale"] = float(cfg)
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive number (no 'auto'), got {batch_size!r}")
        if int(mc_num) < 1 or int(mc_batch_size) < 1:
            raise ValueError(f"mc_num and mc_batch_size must be positive, got {mc_num} and {mc_batch_size}")
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.mc_num, self.mc_batch_size = int(mc_num), int(mc_batch_size)
        self.estimator, self.is_check_greedy = estimator, _as_bool(is_check_greedy)

        self.accelerator = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # launched with accelerate / torchrun: data parallel
            from accelerate import Accelerator

            accelerator = Accelerator()
            if accelerator.num_processes > 1:
                self.accelerator, device = accelerator, str(accelerator.device)
                self._rank, self._world_size = accelerator.process_index, accelerator.num_processes
            else:  # e.g. torchrun on CPUs without ACCELERATE_USE_CPU=1: every process would run every request
                logger.warning(
                    "WORLD_SIZE=%s but accelerate set up a single process: not data parallel (on CPUs, set "
                    "ACCELERATE_USE_CPU=1)",
                    os.environ["WORLD_SIZE"],
                )
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            if device is not None:  # lm_eval's --device defaults to cuda:0
                logger.warning("device %r is not available: running on the CPU", device)
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if isinstance(pretrained, str):
            model, loaded_tokenizer = load_model(pretrained, dtype, device)
            tokenizer = tokenizer or loaded_tokenizer
        else:
            if tokenizer is None:
                raise ValueError(
                    "a model passed as an object needs its tokenizer: DiffusionLM(model, tokenizer=...)"
                )
            model = pretrained.to(device).eval()
        if isinstance(tokenizer, str):
            from ..models.auto import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        if peft is not None:
            model = _attach_adapter(model, peft)
        self.model, self.tokenizer = model, tokenizer
        self._device = torch.device(device)
        self.pretrained_name = (
            pretrained if isinstance(pretrained, str) else type(unwrap_model(model)).__name__
        )
        self.diffusion = DiffusionConfig.from_model_config(unwrap_model(model).config)
        self.generation_config = model.diffusion_generation_config.update(**generation_kwargs)
        self._explicit = set(generation_kwargs)  # model arguments win over the task's generation arguments
        self.cfg = self.generation_config.cfg_scale  # one guidance scale for every request type
        self.stats: dict[str, float] = defaultdict(float)
        self.decoded_configs: list[dict[str, Any]] = []  # what generate_until ran with: distinct, in order
        self._truncation_warned = False

    # ------------------------------------------------------------------------------------------ tokenisation
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return eos if eos is not None else self.tokenizer.pad_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or self.pretrained_name).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The ids of ``string``, after the tokens the tokenizer puts in front (BOS, ``[CLS]``) but never the
        ones it puts after (``[SEP]``): lm-eval reads a continuation as the tail of ``context + continuation``."""
        if add_special_tokens is None:  # a chat rendering already starts with its BOS
            bos = self.tokenizer.bos_token
            add_special_tokens = not (bos and string.startswith(bos))
        ids = self.tokenizer(string, add_special_tokens=False)["input_ids"]
        return self._prefix_ids + ids if add_special_tokens else ids

    @functools.cached_property
    def _prefix_ids(self) -> list[int]:
        """The special tokens the tokenizer adds in front of a text, found on a probe."""
        plain = self.tokenizer("a", add_special_tokens=False)["input_ids"]
        full = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        starts = [i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain]
        return full[: starts[0]] if starts else []

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        if chat_template is False or chat_template is None:
            return None
        return chat_template if isinstance(chat_template, str) else self.tokenizer.chat_template

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # ------------------------------------------------------------------------------------------ data parallel
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.accelerator is None else self.accelerator.gather(tensor)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        if self.accelerator is None:
            return [obj]
        gathered = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    # ------------------------------------------------------------------------------------------ generation
    def _generation_length(self, max_gen_toks: int | None) -> int:
        """The task's ``max_gen_toks`` rounded up to whole blocks, unless ``max_new_tokens`` was a model argument."""
        if "max_new_tokens" in self._explicit or max_gen_toks is None:
            return self.generation_config.max_new_tokens
        block = self.generation_config.block_length or self.diffusion.block_size or int(max_gen_toks)
        return math.ceil(int(max_gen_toks) / block) * block

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Decode every request's context; cut each completion at the first of its ``until`` strings."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            kwargs = dict(request.args[1])
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            do_sample = kwargs.pop("do_sample", None)
            temperature = kwargs.pop("temperature", None)
            max_gen_toks = kwargs.pop("max_gen_toks", None)
            if kwargs:
                logger.warning("t3d model ignores generation arguments %s of the task", sorted(kwargs))
            if do_sample is False:
                temperature = 0.0
            groups[(tuple(until), max_gen_toks, temperature)].append(index)
        results: list[str] = [""] * len(requests)
        totals = [0.0, 0.0, 0.0, 0.0]  # samples, tokens, nfe, seconds of this call on this process
        real = len(requests) - self._padding(requests)  # the stats count real samples only
        generator = torch.Generator(device=self._device).manual_seed(self.seed)
        bar = tqdm(total=len(requests), desc="t3d generate_until", disable=disable_tqdm or self.rank != 0)
        used: list[dict[str, Any]] = []
        for (until, max_gen_toks, temperature), indices in groups.items():
            overrides: dict[str, Any] = {"max_new_tokens": self._generation_length(max_gen_toks)}
            if temperature is not None and "temperature" not in self._explicit:
                overrides["temperature"] = float(temperature)
            config = self.generation_config.update(**overrides)
            used.append(config.to_dict())
            contexts = [requests[i].args[0] for i in indices]
            out = generate_completions(
                self.model,
                self.tokenizer,
                contexts,
                config,
                use_chat_template=False,  # lm-eval renders the chat template itself (--apply_chat_template)
                batch_size=self.batch_size,
                generator=generator,
                progress=False,
                truncate_prompts=True,  # lm-eval's convention: contexts are cut from the left
            )
            for i, completion in zip(indices, out.completions):
                for stop in until:
                    if stop:
                        completion = completion.split(stop, 1)[0]
                results[i] = completion
                self.cache_hook.add_partial("generate_until", requests[i].args, completion)
            kept = [k for k, i in enumerate(indices) if i < real]
            seconds = out.seconds * len(kept) / len(indices)  # the padding's share of the time goes with it
            counts = (
                len(kept),
                sum(out.num_tokens[k] for k in kept),
                sum(out.nfe[k] for k in kept),
                seconds,
            )
            for k, value in enumerate(counts):
                totals[k] += value
            bar.update(len(indices))
        bar.close()
        self._record(totals)  # once per call: every process makes the same calls (lm-eval pads the requests)
        self._record_configs(used)
        logger.info("t3d decoding: %s", self.decoding_stats())
        return results

    def _padding(self, requests: list[Any]) -> int:
        """How many of this process's requests are lm-eval's padding: with several processes it appends copies of
        the last request (``repeats`` times each, the same object) so that every process makes the same calls."""
        if self.world_size == 1 or not requests:
            return 0
        tail = 0
        while tail < len(requests) and requests[-1 - tail] is requests[-1]:
            tail += 1
        return max(0, tail - int(getattr(requests[-1], "repeats", None) or 1))

    def _record(self, totals: list[float]) -> None:
        """Add this call's totals, summed over processes, to :attr:`stats`."""
        summed = self.all_gather(torch.tensor([totals], dtype=torch.float64, device=self._device)).sum(0)
        for key, value in zip(("samples", "tokens", "nfe", "seconds"), summed.tolist()):
            self.stats[key] += value

    def _record_configs(self, used: list[dict[str, Any]]) -> None:
        """Add the configs this call decoded with, on every process, to :attr:`decoded_configs` (each once)."""
        if self.accelerator is not None:  # another process's share may hold other generation arguments
            gathered: list[Any] = [None] * self.world_size
            torch.distributed.all_gather_object(gathered, used)
            used = [config for part in gathered for config in part]
        for config in used:
            if config not in self.decoded_configs:
                self.decoded_configs.append(config)

    def decoding_stats(self) -> dict[str, float]:
        """NFE and speed of every ``generate_until`` call so far, over all processes.

        ``mean_nfe``: denoising forward passes per sample; ``tokens_per_second``: generated tokens (up to the first
        EOS) per second inside ``diffusion_generate``, per process (all tokens over all processes' decoding
        time; NaN without measured time, :func:`t3d_trl.evaluation.metrics.throughput`); ``tokens_per_step``:
        generated tokens per forward pass.
        """
        s = self.stats
        if not s["samples"]:
            return {}
        return {
            "samples": int(s["samples"]),
            "mean_nfe": s["nfe"] / s["samples"],
            "mean_output_length": s["tokens"] / s["samples"],
            "tokens_per_second": throughput(s["tokens"], s["seconds"]),
            "tokens_per_step": s["tokens"] / s["nfe"] if s["nfe"] else float("nan"),
        }

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval writes into the results' ``config``: the decoding settings and their measured cost.

        ``t3d_generation_config`` holds the settings ``generate_until`` decoded with (the task's ``max_gen_toks``
        and ``temperature`` applied): one config, or a list of the distinct ones in order of first use when the
        tasks asked for several. Without a ``generate_until`` request, nothing decoded: it holds the model's
        settings (saved, with the model arguments) and ``t3d_generation_config_source`` says ``"model"``.
        """
        ran = self.decoded_configs
        recorded: dict[str, Any] | list[dict[str, Any]] = self.generation_config.to_dict()
        if ran:
            recorded = ran[0] if len(ran) == 1 else list(ran)
        return {
            "t3d_generation_config": recorded,
            "t3d_generation_config_source": "generate_until" if ran else "model",
            "t3d_loglikelihood": {
                "mc_num": self.mc_num,
                "seed": self.seed,
                "estimator": self.estimator,
                "cfg": self.cfg,
                "is_check_greedy": self.is_check_greedy,
            },
            "t3d_decoding": self.decoding_stats(),
        }

    # ------------------------------------------------------------------------------------------ scoring
    def _collator(self) -> DataCollatorForDiffusion:
        # Block-causal models: the ELBO's blocks are the model's attention blocks (bidirectional: one group).
        block = (self.diffusion.block_size if self.diffusion.is_block_causal else None) or 1
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_token_id
        return DataCollatorForDiffusion(self.diffusion, block, pad, states="random", seed=self.seed)

    def _request_rng(self, context: list[int], continuation: list[int]) -> np.random.Generator:
        """The stratified estimator's noise: keyed on ``(seed, request)``, so the choices of one question draw
        independent noise and a rerun, another batch or another process draws the same."""
        digest = hashlib.sha256(np.asarray([len(context), *context, *continuation], dtype=np.int64).tobytes())
        return np.random.default_rng(
            [self.seed & 0xFFFFFFFF, *np.frombuffer(digest.digest()[:16], np.uint32)]
        )

    def _noisy_rows(
        self, context: list[int], continuation: list[int], collator: DataCollatorForDiffusion
    ) -> list[dict[str, Any]]:
        """The ``mc_num`` rows of one request, with their noise (``random_t``: the collator draws it per row)."""
        rows = [
            {"prompt_ids": context, "completion_ids": continuation, "row_index": j}
            for j in range(self.mc_num)
        ]
        if self.estimator == "stratified":
            groups = np.zeros(len(continuation), dtype=np.int64)
            if self.diffusion.is_block_causal:  # one group per block; the first shares the context's tail
                groups = (
                    len(context) % collator.block_length + np.arange(len(continuation))
                ) // collator.block_length
            masked, prob = stratified_masks(groups, self.mc_num, self._request_rng(context, continuation))
            for row, row_masked, row_prob in zip(rows, masked, prob):
                row["masked"], row["mask_prob"] = row_masked, row_prob
        return rows

    def _logits(self, batch: dict[str, torch.Tensor], mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """Logits at ``batch["keep"]``; with ``cfg``, LLaDA's guidance over the same rows with the prompt masked."""
        ids, positions = batch["input_ids"], batch["position_ids"]
        if self.cfg:
            prompt = batch["valid"] & (
                positions < prompt_len
            )  # block-causal: the noisy copy's prompt tail too
            ids = torch.cat([ids, ids.masked_fill(prompt, self.diffusion.mask_token_id)])
            mask = mask.repeat(2, *[1] * (mask.dim() - 1))
            positions = positions.repeat(2, 1)
        logits, _ = diffusion_forward(self.model, self.diffusion, ids, mask, positions, keep=batch["keep"])
        if not self.cfg:
            return logits.float()
        return guide_logits(*logits.chunk(2), self.cfg)

    @torch.no_grad()
    def _elbo_samples(
        self, context: list[int], continuation: list[int], collator: DataCollatorForDiffusion
    ) -> torch.Tensor:
        """The ``mc_num`` Monte Carlo samples of the ELBO of ``log p(continuation | context)`` (float64, CPU)."""
        dtype = unwrap_model(self.model).dtype
        rows = self._noisy_rows(context, continuation, collator)
        samples = []
        for start in range(0, len(rows), self.mc_batch_size):
            batch = {
                k: v.to(self._device) for k, v in collator(rows[start : start + self.mc_batch_size]).items()
            }
            mask = diffusion_attention_mask(
                batch,
                collator.block_length,
                self.diffusion.is_block_causal,
                dtype,
                accepts_4d_mask(self.model),
            )
            logps = self._logits(batch, mask, len(context)).log_softmax(-1)
            logps = logps.gather(-1, batch["targets"].unsqueeze(-1)).squeeze(-1)
            weights = torch.where(
                batch["loss_mask"], 1.0 / batch["mask_prob"], torch.zeros_like(batch["mask_prob"])
            )
            samples.append((logps.double() * weights.double()).sum(-1).cpu())
        return torch.cat(samples)

    def _elbo(self, context: list[int], continuation: list[int], collator: DataCollatorForDiffusion) -> float:
        """Monte Carlo ELBO of ``log p(continuation | context)``: mean over ``mc_num`` noisy copies."""
        return float(self._elbo_samples(context, continuation, collator).mean())

    def _greedy(self, context: list[int], continuation: list[int]) -> bool:
        """LLaDA's ``is_greedy``: a canvas of exactly ``len(continuation)`` masks after the context, decoded one
        most-confident token per step (greedy, guided with ``cfg``), reproduces the continuation. The model's
        decoding settings (block length, tokens per step, threshold, ``max_new_tokens``...) do not apply.
        Block-causal models decode in their attention blocks, the continuation rounded up to whole blocks."""
        if not self.is_check_greedy:
            return False
        block = self.diffusion.block_size if self.diffusion.is_block_causal else len(continuation)
        config = DiffusionGenerationConfig(
            max_new_tokens=math.ceil(len(continuation) / block) * block,
            block_length=block,
            tokens_per_step=1,
            temperature=0.0,
            stop_at_eos=False,
            cfg_scale=self.cfg,
        )
        prompt = torch.tensor([context], dtype=torch.long, device=self._device)
        out = self.model.diffusion_generate(prompt, torch.ones_like(prompt), generation_config=config)
        return out[0, len(context) : len(context) + len(continuation)].tolist() == list(continuation)

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, **kwargs: Any) -> list:
        collator = self._collator()
        results = []
        for pair, context, continuation in tqdm(
            requests, desc="t3d loglikelihood", disable=disable_tqdm or self.rank != 0
        ):
            if not continuation:
                raise ValueError(f"loglikelihood needs a non-empty continuation, got {pair!r}")
            context = self._fitted_context(context, continuation)
            answer = (self._elbo(context, continuation, collator), self._greedy(context, continuation))
            self.cache_hook.add_partial("loglikelihood", pair, answer)
            results.append(answer)
        return results

    def _fitted_context(self, context: list[int], continuation: list[int]) -> list[int]:
        """``context`` cut from the left to fit the model's positions beside ``continuation`` (rounded up to
        whole blocks, as the greedy check decodes it), as lm-eval's Hugging Face model truncates."""
        limit = max_positions(self.model)
        block = self.diffusion.block_size if self.diffusion.is_block_causal else len(continuation)
        needed = math.ceil(len(continuation) / block) * block
        if limit is not None and needed >= limit:
            raise ValueError(
                f"a continuation of {len(continuation)} tokens does not fit the model's {limit} positions"
            )
        fitted = left_fitted(context, needed, limit)
        if len(fitted) < len(context) and not self._truncation_warned:
            self._truncation_warned = True
            logger.warning("contexts longer than the model's %d positions are cut from the left", limit)
        return fitted

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(
            "the t3d model does not implement loglikelihood_rolling (perplexity tasks such as wikitext): a diffusion "
            "LM has no left-to-right likelihood to roll over a document; use generate_until or multiple-choice tasks"
        )
