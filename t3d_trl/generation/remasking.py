"""Per-step token choice and commit rules of masked diffusion decoding.

A step proposes a token ``x0`` for every position of the current block and a score saying how sure it is;
the commit rule then unmasks the best-scored masked positions (a fixed quota per step for static decoding,
everything above a threshold for dynamic decoding). Everything here works on the current block only, so its
cost is independent of the canvas length.
"""

from __future__ import annotations

import torch


def transfer_schedule(
    num_masked: torch.Tensor, steps: int, schedule: str = "llada", block_length: int | None = None
) -> torch.Tensor:
    """Tokens to commit at each of ``steps`` steps for blocks holding ``num_masked`` masks.

    ``llada`` (LLaDA's ``get_num_transfer_tokens``): every step commits ``m // steps`` tokens and the first
    ``m % steps`` steps one more. ``sdar`` (SDAR's ``generate.py``): the same split of ``block_length`` instead
    of ``m``, capped by the masks left, so a block partly filled by the prompt finishes in fewer steps.
    ``dream`` (Dream's ``diffusion_generate``): with timesteps ``t = linspace(1, 1e-3, steps + 1)`` in float32,
    step ``i`` commits ``int(n_i * (1 - t[i+1] / t[i]))`` of the ``n_i`` masks left and the last step the rest
    (the counts grow along the block, e.g. 1, 2, 2, 2, 2, 2, 2, 3 for 16 tokens in 8 steps).
    Every rule commits all ``m`` masks over the ``steps`` steps. Returns ``[B, steps]`` long.
    """
    arange = torch.arange(steps, device=num_masked.device).unsqueeze(0)
    if schedule == "llada":
        base = num_masked.unsqueeze(1) // steps
        return base + (arange < (num_masked % steps).unsqueeze(1)).long()
    if schedule == "sdar":
        if block_length is None:
            raise ValueError("the sdar schedule needs block_length")
        quota = (block_length // steps + (arange < block_length % steps).long()).expand(len(num_masked), -1)
        before = quota.cumsum(-1) - quota
        return torch.minimum(quota, (num_masked.unsqueeze(1) - before).clamp_min(0))
    if schedule == "dream":
        t = torch.linspace(1, 1e-3, steps + 1, device=num_masked.device)
        left = num_masked.clone()
        counts = []
        for i in range(steps):
            k = (left.float() * (1 - t[i + 1] / t[i])).long() if i < steps - 1 else left
            counts.append(k)
            left = left - k
        return torch.stack(counts, dim=1)
    raise ValueError(f"unknown schedule {schedule!r}")


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to ``-inf`` (no-op when both are off)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def propose_tokens(
    logits: torch.Tensor,
    temperature: float,
    remasking: str,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    mask_token_id: int | None = None,
    noise: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick ``x0`` for every position and score it.

    Sampling is Gumbel-max in float64 (``argmax(filter(logits / T) + G)``, top-k / top-p filtering applied to
    the tempered logits, as transformers, Dream and SDAR apply it), which draws exactly from
    ``softmax(filter(logits / T))``; ``temperature == 0`` is the plain argmax. Scores (higher
    = commit first) are computed from the model's unfiltered distribution at temperature 1, as in the LLaDA
    reference, so filtering changes which token is drawn, not how sure the model is of it:
    ``low_confidence`` = p(x0), ``margin`` = p(top1) - p(top2), ``entropy`` = minus the predictive entropy,
    ``random`` = uniform noise. Probabilities are a float64 softmax, as LLaDA's and Fast-dLLM's samplers
    compute them: a float32 one saturates near p = 1 (distinct probabilities collapse to 1.0), and the tied
    positions would be committed in another order than upstream's.

    Args:
        logits: ``[B, L, V]`` logits of the current block.
        mask_token_id: never proposed (committing a mask would leave the position masked); scores still use
            the full distribution, so they equal the reference's whenever its choice is a real token.
        noise: ``(uniform, random_score)`` drawn beforehand by :func:`draw_noise` (the compiled step takes its
            randomness as inputs); ``None`` draws it here from ``generator``.

    Returns:
        ``(x0, score)``, both ``[B, L]``; ``score`` is float64.
    """
    if noise is None:
        noise = draw_noise(logits.shape, temperature, remasking, generator, logits.device)
    uniform, random_score = noise
    logits = logits.float()
    choice = logits
    if mask_token_id is not None:
        choice = logits.index_fill(-1, torch.tensor([mask_token_id], device=logits.device), float("-inf"))
    if temperature > 0:
        gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-300)))
        # Tempered first, then filtered (as transformers, Dream and SDAR do): top_p's nucleus is that of the
        # distribution sampled.
        x0 = (filter_logits(choice.double() / temperature, top_k, top_p) + gumbel).argmax(-1)
    else:
        x0 = choice.argmax(-1)
    return x0, confidence_score(logits, x0, remasking, random_score)


def draw_noise(
    shape: torch.Size | tuple[int, ...],
    temperature: float,
    remasking: str,
    generator: torch.Generator | None,
    device: torch.device | str,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The random inputs of one proposal over logits of ``shape`` ``[B, L, V]``: float64 uniforms for the
    Gumbel noise (when sampling) and the ``random`` rule's scores, drawn in that order from ``generator``, on
    its device (a CPU generator serves a GPU model too, at the cost of a copy), then moved to ``device``."""
    where = generator.device if generator is not None else device
    uniform = None
    if temperature > 0:
        uniform = torch.rand(shape, dtype=torch.float64, device=where, generator=generator).to(device)
    random_score = None
    if remasking == "random":
        random_score = torch.rand(shape[:-1], device=where, generator=generator).double().to(device)
    return uniform, random_score


def confidence_score(
    logits: torch.Tensor, x0: torch.Tensor, remasking: str, random_score: torch.Tensor | None = None
) -> torch.Tensor:
    """The float64 score of proposing ``x0`` under ``logits`` ``[B, L, V]`` (see :func:`propose_tokens`).

    ``low_confidence`` is ``softmax(logits.double())`` gathered at ``x0``, exactly LLaDA's and Fast-dLLM's
    expression, so probabilities equal there are equal here too (and :func:`select_static` orders them with
    ``torch.topk``, as they do).
    """
    if remasking == "random":
        if random_score is None:
            raise ValueError("remasking='random' needs its random scores (see draw_noise)")
        return random_score
    probs = logits.double().softmax(-1)
    if remasking == "low_confidence":
        return probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    if remasking == "margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if remasking == "entropy":
        return (probs * probs.log().nan_to_num(neginf=0.0)).sum(-1)
    raise ValueError(f"unknown remasking {remasking!r}")


def select_static(score: torch.Tensor, masked: torch.Tensor, quota: torch.Tensor) -> torch.Tensor:
    """Commit the ``quota[b]`` best-scored masked positions of each row. Returns a ``[B, L]`` bool mask."""
    k = int(quota.max())
    commit = torch.zeros_like(masked)
    if k == 0:
        return commit
    score = score.masked_fill(~masked, float("-inf"))
    # torch.topk, as LLaDA's and Fast-dLLM's code commit: among equal scores (float64 probabilities tie at 1.0
    # past a logit gap of ~37) the order is topk's, not the position's.
    top = score.topk(k, dim=-1).indices
    take = torch.arange(k, device=score.device).unsqueeze(0) < quota.unsqueeze(1)
    commit.scatter_(1, top, take)
    return commit & masked


def select_dynamic(
    score: torch.Tensor,
    masked: torch.Tensor,
    threshold: float,
    quota: torch.Tensor | None = None,
) -> torch.Tensor:
    """Commit every masked position scored at or above ``threshold``.

    Without ``quota`` (Fast-dLLM rule) at least the single best masked position of each row with masks is
    committed, so decoding always progresses. With ``quota`` (T3D reference engine rule) rows that clear fewer
    than ``quota[b]`` positions are topped up to it with the best remaining ones.
    """
    commit = masked & (score >= threshold)
    floor = masked.any(-1).long() if quota is None else torch.minimum(quota, masked.sum(-1))
    short = commit.sum(-1) < floor
    if short.any():
        commit |= select_static(score, masked, torch.where(short, floor, torch.zeros_like(floor)))
    return commit
