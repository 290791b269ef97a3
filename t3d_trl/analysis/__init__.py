"""Analysis of few-step decoding: the factorization error (conditional total correlation) of a diffusion LM."""

from .total_correlation import TotalCorrelationConfig, TotalCorrelationResult, total_correlation

__all__ = ["TotalCorrelationConfig", "TotalCorrelationResult", "total_correlation"]
