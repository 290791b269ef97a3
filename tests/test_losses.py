"""Each objective pinned to values computed by hand from its equation on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from t3d_trl.trainer import losses

# Positions the mask excludes (prompt, padding, already decoded) hold absurd values: they must not count.
GARBAGE = -1e4


def test_trajectory_kl_is_the_mean_cross_entropy_over_masked_positions():
    logps = torch.tensor([[-1.0, GARBAGE, -3.0], [-0.5, GARBAGE, GARBAGE]])
    mask = torch.tensor([[True, False, True], [True, False, False]])
    assert losses.trajectory_kl_loss(logps, mask).item() == pytest.approx((1 + 3 + 0.5) / 3)
    # An explicit normaliser (the accumulated step's token count) replaces the local count.
    assert losses.trajectory_kl_loss(logps, mask, num_items=9).item() == pytest.approx(4.5 / 9)


def test_loss_without_masked_positions_is_zero_not_nan():
    logps = torch.full((2, 3), GARBAGE)
    assert losses.trajectory_kl_loss(logps, torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


@pytest.mark.parametrize(
    "weighting, expected",
    [
        # w_i = (B - pi_i + 1) / B with B = 4
        ("early", [4 / 4, 3 / 4, 2 / 4, 1 / 4]),
        ("uniform", [1.0, 1.0, 1.0, 1.0]),
        # w_i = pi_i / B
        ("late", [1 / 4, 2 / 4, 3 / 4, 4 / 4]),
    ],
)
def test_path_weights_follow_the_paper(weighting, expected):
    step = torch.tensor([1, 2, 3, 4])
    assert losses.path_weights(step, budget=4, weighting=weighting).tolist() == pytest.approx(expected)


def test_path_weights_are_zero_outside_the_budget():
    # pi = 0 marks a position that is not a completion token (prompt or padding).
    assert losses.path_weights(torch.tensor([0, 1, 2]), budget=2).tolist() == pytest.approx([0.0, 1.0, 0.5])


def test_path_consistency_weights_each_masked_token():
    logps = torch.tensor([[-1.0, -2.0, GARBAGE], [-4.0, GARBAGE, -8.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    step = torch.tensor([[1, 2, 1], [2, 0, 1]])
    weights = losses.path_weights(step, budget=2)  # [[1, .5, 1], [.5, 0, 1]]
    expected = (1 * 1 + 0.5 * 2 + 0.5 * 4) / 3
    assert losses.path_consistency_loss(logps, mask, weights).item() == pytest.approx(expected)


def test_sequence_logratio_is_the_mean_over_masked_positions():
    student = torch.tensor([[-1.0, -2.0, GARBAGE], [GARBAGE, GARBAGE, GARBAGE]])
    ref = torch.tensor([[-2.0, -2.5, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    ratio = losses.sequence_logratio(student, ref, mask)
    assert ratio.tolist() == pytest.approx([(1.0 + 0.5) / 2, 0.0])


def test_ddo_loss_matches_the_step_ddo_equation():
    real, fake = torch.tensor([2.0, 0.0]), torch.tensor([-1.0, 0.0])
    loss = losses.ddo_loss(real, fake, beta=0.5, fake_weight=0.5)

    def sigmoid(z):
        return 1 / (1 + math.exp(-z))

    # -log sigma(beta * r_real) - alpha * log(1 - sigma(beta * r_fake))
    first = -math.log(sigmoid(0.5 * 2.0)) - 0.5 * math.log(1 - sigmoid(0.5 * -1.0))
    # Right after a reference refresh both ratios are 0: (1 + alpha) log 2.
    assert loss.tolist() == pytest.approx([first, 1.5 * math.log(2)])


def test_expected_logratio_is_the_exact_fake_expectation_with_no_first_order_push():
    torch.manual_seed(0)
    ref = torch.randn(3, 5).log_softmax(-1)
    student = torch.randn(3, 5).log_softmax(-1)
    expected = losses.expected_logratio(student, ref)
    # Monte Carlo over samples of the reference agrees; the value is -KL(p_ref || p_theta) <= 0.
    draws = torch.distributions.Categorical(logits=ref).sample((200_000,))
    sampled = (student.gather(-1, draws.T) - ref.gather(-1, draws.T)).mean(-1)
    assert torch.allclose(expected, sampled, atol=0.02)
    assert torch.allclose(expected, -(ref.exp() * (ref - student)).sum(-1)) and (expected <= 0).all()

    # At p_theta = p_ref the fake term has no gradient; the argmax stand-in pushes the argmax token down.
    logits = torch.randn(4, 6, requires_grad=True)
    ref_logps = logits.detach().log_softmax(-1)
    losses.expected_logratio(logits.log_softmax(-1), ref_logps).sum().backward()
    assert logits.grad.abs().max() < 1e-6
    logits.grad = None
    top = ref_logps.argmax(-1, keepdim=True)
    (logits.log_softmax(-1).gather(-1, top) - ref_logps.gather(-1, top)).sum().backward()
    assert logits.grad.abs().max() > 0.1
    with pytest.raises(ValueError, match="differ in shape"):
        losses.expected_logratio(student, ref[:, :4])


def test_ddo_loss_is_stable_for_large_ratios():
    loss = losses.ddo_loss(torch.tensor([-1e4]), torch.tensor([1e4]), beta=1.0, fake_weight=1.0)
    assert torch.isfinite(loss).all() and loss.item() == pytest.approx(2e4)


def test_mdlm_loss_weights_by_inverse_mask_probability_over_all_targets():
    logps = torch.tensor([[-1.0, -2.0, GARBAGE]])
    mask = torch.tensor([[True, True, False]])
    prob = torch.tensor([[0.5, 0.25, 0.5]])
    # ELBO: sum over masked of CE / t, averaged over the 4 target tokens (masked or not)
    assert losses.mdlm_loss(logps, mask, prob, num_items=4).item() == pytest.approx((1 / 0.5 + 2 / 0.25) / 4)


def test_certainty_forcing_penalises_entropy_of_correct_predictions_only():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [50.0, -50.0]]])
    targets = torch.tensor([[0, 0, 1]])
    mask = torch.tensor([[True, True, False]])
    loss = losses.certainty_forcing_loss(logits, targets, mask, entropy_weight=2.0, temperature=0.5)

    ce = math.log(1 + math.exp(-2.0)) + math.log(1 + math.exp(1.0))  # -log softmax at the target
    p = 1 / (1 + math.exp(-2.0 / 0.5))  # position 0 is correct: entropy of softmax(logits / T)
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))  # position 1 is wrong: no penalty
    assert loss.item() == pytest.approx((ce + 2.0 * entropy) / 2, rel=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="weighting"):
        losses.path_weights(torch.tensor([1]), budget=2, weighting="middle")
    with pytest.raises(ValueError, match="budget"):
        losses.path_weights(torch.tensor([1]), budget=0)
    with pytest.raises(ValueError, match="bool"):
        losses.trajectory_kl_loss(torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="shape"):
        losses.ddo_loss(torch.zeros(2), torch.zeros(3))
