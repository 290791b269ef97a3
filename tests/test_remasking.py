"""Confidence scores and commit rules (``generation/remasking.py``) on logits as confident as a real LLM's."""

from __future__ import annotations

import pytest
import torch

from t3d_trl.generation.remasking import propose_tokens, select_dynamic, select_static


def _confident_logits(std: float, seed: int, shape=(64, 8, 50)) -> torch.Tensor:
    """Logits whose standard deviation is that of a confident bf16 LLM's (16-24): many positions have
    probabilities within 2^-24 of 1, which a float32 softmax cannot tell apart."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * std


def _reference_scores(logits: torch.Tensor, remasking: str) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA's / Fast-dLLM's expression written out: ``p = softmax(logits.to(float64))``, the argmax's
    probability; margin and entropy from the same float64 probabilities."""
    x0 = logits.argmax(-1)
    p = torch.nn.functional.softmax(logits.to(torch.float64), dim=-1)
    if remasking == "low_confidence":
        return x0, torch.gather(p, -1, x0[..., None])[..., 0]
    if remasking == "margin":
        ordered = p.sort(dim=-1, descending=True).values
        return x0, ordered[..., 0] - ordered[..., 1]
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    return x0, (p * logp).sum(-1)


def _reference_commit(confidence: torch.Tensor, masked: torch.Tensor, k: int) -> torch.Tensor:
    """Fast-dLLM's ``get_transfer_index``: ``torch.topk`` of the masked positions' confidence, row by row."""
    confidence = torch.where(masked, confidence, torch.tensor(-float("inf"), dtype=confidence.dtype))
    commit = torch.zeros_like(masked)
    for row in range(confidence.shape[0]):
        commit[row, torch.topk(confidence[row], k=k).indices] = True
    return commit & masked


@pytest.mark.parametrize("std", [16.0, 24.0])
@pytest.mark.parametrize("remasking", ["low_confidence", "margin", "entropy"])
def test_scores_rank_like_upstream_float64_softmax(std, remasking):
    logits = _confident_logits(std, seed=int(std))
    masked = torch.rand(logits.shape[:2], generator=torch.Generator().manual_seed(1)) < 0.8
    masked[:, 0] = True
    x0, score = propose_tokens(logits, 0.0, remasking)
    ref_x0, ref_score = _reference_scores(logits, remasking)
    assert torch.equal(x0, ref_x0)
    assert score.dtype == torch.float64
    assert torch.equal(score, ref_score)
    for k in (1, 2, 3):
        quota = torch.minimum(torch.full((logits.shape[0],), k), masked.sum(-1))
        ours = select_static(score, masked, quota)
        for row in range(logits.shape[0]):
            expected = _reference_commit(ref_score[row : row + 1], masked[row : row + 1], int(quota[row]))
            assert torch.equal(ours[row], expected[0]), (k, row)


def test_float32_scores_would_reorder_ties():
    # The failure the float64 score removes: float32 probabilities collapse to 1.0 and the commit order changes.
    logits = _confident_logits(24.0, seed=24)
    masked = torch.ones(logits.shape[:2], dtype=torch.bool)
    _, ref_score = _reference_scores(logits, "low_confidence")
    x0 = logits.argmax(-1)
    float32 = (logits.gather(-1, x0[..., None])[..., 0] - logits.logsumexp(-1)).exp()
    quota = torch.full((logits.shape[0],), 2)
    reference = torch.cat([_reference_commit(ref_score[r : r + 1], masked[r : r + 1], 2) for r in range(64)])
    assert not torch.equal(select_static(float32, masked, quota), reference)
    assert torch.equal(
        select_static(propose_tokens(logits, 0.0, "low_confidence")[1], masked, quota), reference
    )


@pytest.mark.parametrize("threshold", [0.9, 1 - 2**-30, 1.0])
def test_threshold_compares_the_float64_probability(threshold):
    logits = _confident_logits(20.0, seed=5)
    masked = torch.ones(logits.shape[:2], dtype=torch.bool)
    _, score = propose_tokens(logits, 0.0, "low_confidence")
    _, confidence = _reference_scores(logits, "low_confidence")
    ours = select_dynamic(score, masked, threshold)
    # Fast-dLLM: every position at or above the threshold, and always the most confident one.
    expected = confidence >= threshold
    expected[torch.arange(64), confidence.argmax(-1)] = True
    assert torch.equal(ours, expected)


def test_top_p_keeps_the_nucleus_of_the_tempered_distribution():
    # Tempered first, then filtered (transformers, Dream, SDAR): at T=3 the nucleus of 0.9 holds five tokens;
    # filtering the untempered logits kept token 0 alone (p = 0.903 at T=1), so it was always drawn.
    logits = torch.tensor([4.0, 1.0, 0.5, 0.0, -1.0, -2.0]).expand(1, 20000, 6)
    generator = torch.Generator().manual_seed(0)
    x0, _ = propose_tokens(logits, 3.0, "low_confidence", top_p=0.9, generator=generator)
    frequency = torch.bincount(x0.flatten(), minlength=6).double() / x0.numel()
    tempered = (logits[0, 0] / 3).softmax(-1)
    expected = torch.cat([tempered[:5] / tempered[:5].sum(), torch.zeros(1)]).double()
    assert frequency[5] == 0 and torch.allclose(frequency, expected, atol=0.015)
