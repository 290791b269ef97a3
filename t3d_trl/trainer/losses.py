"""The training objectives of T3D and its baselines, as small pure functions.

Equation names refer to the T3D paper ("Few-Step Diffusion Language Models via Trajectory Self-Distillation").
Every function takes per-position tensors laid out ``[batch, length]`` together with a boolean ``mask`` that
selects the positions the objective covers (the masked positions of the state ``x_t``); padding, prompt and
already-decoded positions are excluded by that mask, never by convention.

Token-level losses return ``sum over masked positions / num_items``. ``num_items`` defaults to the number of
masked positions (a plain mean). The trainer takes the sums (``num_items=1``) and divides them by the count over
the whole gradient-accumulation step and all processes, which is how ``transformers.Trainer`` normalises
(``num_items_in_batch``); it divides the same sums by this batch's count for its logged metrics.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

PATH_WEIGHTINGS = ("early", "uniform", "late")


def _normalise(
    total: torch.Tensor, mask: torch.Tensor, num_items: int | float | torch.Tensor | None
) -> torch.Tensor:
    if num_items is None:
        num_items = mask.sum().clamp_min(1)  # no masked position: the loss is 0, not NaN
    if torch.is_tensor(num_items):
        num_items = num_items.to(total.device, total.dtype)
    return total / num_items


def _check(values: torch.Tensor, mask: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if values.shape[: mask.dim()] != mask.shape:
        raise ValueError(
            f"values of shape {tuple(values.shape)} do not match mask of shape {tuple(mask.shape)}"
        )


def trajectory_kl_loss(
    logps: torch.Tensor, mask: torch.Tensor, num_items: int | float | torch.Tensor | None = None
) -> torch.Tensor:
    """Trajectory distillation with the forward KL, Eq. (traj-distill): ``-E[log p_theta(x_0 | x_t)]``.

    With the teacher's clean tokens as ``x_0`` this is the cross-entropy of the student at ``x_t`` over the
    masked positions (TD). On randomly masked teacher outputs it is ReDi's endpoint-distillation loss.

    Args:
        logps: ``[B, L]`` student log-probabilities of the teacher's tokens.
        mask: ``[B, L]`` bool, the masked positions of ``x_t``.
        num_items: normaliser (default: the number of masked positions).
    """
    _check(logps, mask)
    return _normalise(-(logps * mask).sum(), mask, num_items)


def path_weights(
    step: torch.Tensor, budget: int, weighting: Literal["early", "uniform", "late"] = "early"
) -> torch.Tensor:
    """Step-dependent weights of the path-consistency loss (the definition above Eq. (loss-path)).

    ``early`` (the paper's choice): ``w_i = (B - pi_i + 1) / B``; ``uniform``: ``w_i = 1``; ``late``:
    ``w_i = pi_i / B``, where ``pi_i`` in ``[1, B]`` is the step of the decoding budget ``B`` at which token ``i``
    was generated.

    Args:
        step: integer tensor of ``pi_i`` values (entries outside ``[1, B]`` are only allowed where the caller
            masks them out; they get weight 0).
        budget: the decoding budget ``B`` (student steps per block).
        weighting: ``early``, ``uniform`` or ``late``.
    """
    if budget < 1:
        raise ValueError(f"budget must be a positive number of steps, got {budget}")
    if weighting not in PATH_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {PATH_WEIGHTINGS}, got {weighting!r}")
    in_range = (step >= 1) & (step <= budget)
    step = step.to(torch.float32)
    if weighting == "early":
        weights = (budget - step + 1) / budget
    elif weighting == "late":
        weights = step / budget
    else:
        weights = torch.ones_like(step)
    return weights * in_range


def path_consistency_loss(
    logps: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    num_items: int | float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Path-consistency regularisation, Eq. (loss-path): ``-sum_i w_i log p_theta(x_0^i | x_t)``.

    Args:
        logps: ``[B, L]`` student log-probabilities of the teacher's tokens at ``x_t``.
        mask: ``[B, L]`` bool, the masked positions of ``x_t``.
        weights: ``[B, L]`` the ``w_i`` of :func:`path_weights`.
        num_items: normaliser (default: the number of masked positions).
    """
    _check(logps, mask)
    _check(weights, mask)
    return _normalise(-(logps * weights * mask).sum(), mask, num_items)


def sequence_logratio(
    student_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``log p_theta(x_0 | x_t) - log p_ref(x_0 | x_t)`` per sequence, as the MEAN over its masked positions.

    The mean (not the sum) follows the public reference implementation; it keeps ``beta`` meaningful across
    states with many or few masked tokens. Sequences without masked positions get 0.

    Returns:
        ``[B]`` log-ratios.
    """
    _check(student_logps, mask)
    _check(ref_logps, mask)
    count = mask.sum(-1)
    total = ((student_logps - ref_logps) * mask).sum(-1)
    return total / count.clamp_min(1)


def expected_logratio(student_logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """``E_{x ~ p_ref}[log p_theta(x | x_t) - log p_ref(x | x_t)] = -KL(p_ref || p_theta)`` per position.

    The fake expectation of Eq. (step-ddo), computed exactly instead of from one sample: the model factorizes
    over the masked positions, so the sequence-level expectation is the sum (or mean) of these per-position terms.
    Its gradient vanishes at ``p_theta = p_ref``; the reference code's stand-in, the log-ratio of the reference's
    argmax, instead pushes the argmax token down from the first step on.

    Args:
        student_logps: ``[..., V]`` student log-probabilities over the vocabulary.
        ref_logps: ``[..., V]`` reference log-probabilities at the same positions.

    Returns:
        ``[...]`` expected log-ratios (``<= 0``).
    """
    if student_logps.shape != ref_logps.shape:
        raise ValueError(
            f"student and reference log-probabilities differ in shape: {tuple(student_logps.shape)} vs "
            f"{tuple(ref_logps.shape)}"
        )
    return (ref_logps.exp() * (student_logps - ref_logps)).sum(-1)


def ddo_logratios(
    logp_all: torch.Tensor,
    ref_logits: torch.Tensor,
    real: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    fake_estimator: Literal["argmax", "expectation"] = "argmax",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-sequence log-ratios ``log p_theta / p_ref`` of DDO's real and fake terms.

    Args:
        logp_all: ``[N, V]`` student log-probabilities at the ``N`` masked positions (``mask``'s true entries).
        ref_logits: ``[N, V]`` reference logits (float) at the same positions.
        real: ``[B, L]`` student log-probabilities of the targets, laid out on ``mask``.
        targets: ``[N]`` the target tokens at the masked positions.
        mask: ``[B, L]`` the masked positions.
        fake_estimator: ``"argmax"``: the fake sample is the reference's own parallel prediction; ``"expectation"``:
            the exact expectation over ``p_ref`` (:func:`expected_logratio`).
    """
    ref_logp_all = ref_logits.log_softmax(-1)

    def scatter(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(mask.shape, device=values.device, dtype=values.dtype).masked_scatter(mask, values)

    ref_real = scatter(ref_logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    if fake_estimator == "expectation":
        fake = scatter(expected_logratio(logp_all, ref_logp_all))
        ref_fake = torch.zeros_like(fake)
    else:
        fake_tokens = ref_logits.argmax(-1, keepdim=True)  # the reference's own parallel prediction
        fake = scatter(logp_all.gather(-1, fake_tokens).squeeze(-1))
        ref_fake = scatter(ref_logp_all.gather(-1, fake_tokens).squeeze(-1))
    return sequence_logratio(real, ref_real, mask), sequence_logratio(fake, ref_fake, mask)


def ddo_loss(
    real_logratio: torch.Tensor, fake_logratio: torch.Tensor, beta: float = 0.1, fake_weight: float = 0.5
) -> torch.Tensor:
    """Per-state Direct Discriminative Optimization loss, Eq. (step-ddo), with the discriminator of the
    multi-round scheme ``sigma(beta * log p_theta / p_ref)``:

    ``l = -log sigma(beta * r_real) - alpha * log(1 - sigma(beta * r_fake))``

    where ``r_real`` is the log-ratio of the teacher's tokens ("real") and ``r_fake`` that of the reference
    model's own prediction at the same ``x_t`` ("fake"). ``log(1 - sigma(z)) = log sigma(-z)`` keeps it stable.

    Args:
        real_logratio: ``[B]`` from :func:`sequence_logratio` on the teacher's tokens.
        fake_logratio: ``[B]`` from :func:`sequence_logratio` on the reference model's tokens.
        beta: scale of the implicit discriminator (reference code: 0.1; the paper gives no value).
        fake_weight: ``alpha``, weight of the fake term (reference code: 0.5; Eq. step-ddo weighs it 1).

    Returns:
        ``[B]`` per-sequence losses.
    """
    if real_logratio.shape != fake_logratio.shape:
        raise ValueError(
            f"real and fake log-ratios differ in shape: {tuple(real_logratio.shape)} vs {tuple(fake_logratio.shape)}"
        )
    return -F.logsigmoid(beta * real_logratio) - fake_weight * F.logsigmoid(-beta * fake_logratio)


def mdlm_loss(
    logps: torch.Tensor,
    mask: torch.Tensor,
    mask_prob: torch.Tensor,
    num_items: int | float | torch.Tensor,
) -> torch.Tensor:
    """The masked-diffusion (MDLM) objective on real data: ``-sum_{masked} log p_theta(x_0^i | x_t) / t``.

    ``x_t`` masks each token independently with probability ``t ~ U(0, 1]``; the ``1/t`` weight makes this the
    negative ELBO (the loss LLaDA and SDAR are pre-trained and fine-tuned with), so it is normalised by the number
    of target tokens, masked or not. In general each masked token is weighted by the inverse of the probability it
    was masked with, which keeps the estimate unbiased when states are drawn conditioned on holding a mask (the
    collator's ``t / (1 - (1 - t) ** n)``, see ``DataCollatorForDiffusion``).

    Args:
        logps: ``[B, L]`` model log-probabilities of the clean tokens.
        mask: ``[B, L]`` bool, the masked positions.
        mask_prob: ``[B, L]`` the probability each position was masked with (``t`` for independent masking).
        num_items: the number of target (completion) tokens the ELBO is averaged over.
    """
    _check(logps, mask)
    _check(mask_prob, mask)
    weights = torch.where(mask, 1.0 / mask_prob.clamp_min(1e-6), torch.zeros_like(mask_prob))
    return _normalise(-(logps * weights).sum(), mask, num_items)


def certainty_forcing_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    entropy_weight: float = 2.0,
    temperature: float = 0.5,
    num_items: int | float | torch.Tensor | None = None,
) -> torch.Tensor:
    """dParallel's certainty-forcing distillation: cross-entropy on the teacher's tokens plus an entropy penalty.

    ``L = sum_{masked} CE_i + w * sum_{masked, argmax = target} H(softmax(logits_i / T))``, all over ``num_items``.
    The entropy term only acts on positions the model already predicts correctly, pushing them to be confident
    (dParallel: ``w = 2``, ``T = 0.5``). Both terms are averaged over the masked positions, so gradient
    accumulation normalises exactly; dParallel averages the entropy over the correct positions only.

    Args:
        logits: ``[B, L, V]`` model logits.
        targets: ``[B, L]`` the teacher's tokens.
        mask: ``[B, L]`` bool, the masked positions.
        entropy_weight: ``w``.
        temperature: ``T`` applied to the logits inside the entropy.
        num_items: normaliser (default: the number of masked positions).
    """
    _check(logits, mask)
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    selected = logits[mask].float()
    target = targets[mask]
    ce = F.cross_entropy(selected, target, reduction="sum")
    correct = (selected.argmax(-1) == target).detach()
    scaled = (selected / temperature).log_softmax(-1)
    entropy = -(scaled.exp() * scaled).sum(-1)
    return _normalise(ce + entropy_weight * (entropy * correct).sum(), mask, num_items)
