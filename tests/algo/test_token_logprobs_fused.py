"""The fused, chunked log-prob and entropy pass (klguard.algo.loss.token_logprobs_and_entropy) against the plain
computation: values and gradients on random logits, a 49k vocabulary included.

Tolerances come from float32 rounding at the problem's scale, against the plain computation in float64: a
log-softmax entry is `x - lse` with |x|, |lse| <= max|x| + log V, each term rounded to float32 and summed over V
terms in the logsumexp (relative error ~ log2(V) eps32 in the sum, turned absolute by the log), so its error is a
small multiple of eps32 * (max|x| + log V); the gradient `g (onehot - p)` has p's relative error of that size, so
its absolute error is at most that times |g| (p <= 1)."""

from __future__ import annotations

import math

import pytest
import torch

import klguard.algo.loss as loss_module
from klguard.algo.loss import entropy_from_logits, logprobs_from_logits, token_logprobs_and_entropy

EPS32 = torch.finfo(torch.float32).eps


def _scale_tol(x: torch.Tensor, temperature: float) -> float:
    vocab = x.shape[-1]
    return 16 * EPS32 * (float(x.detach().abs().max()) / temperature + math.log(vocab) + 1) * math.log2(vocab)


def _plain64(x: torch.Tensor, labels: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    z = x.double() / temperature
    logp = torch.log_softmax(z, -1)
    lp = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    ent = -(p * torch.where(p > 0, logp, torch.zeros((), dtype=z.dtype))).sum(-1)
    return lp, ent


@pytest.mark.parametrize("vocab", [7, 1000, 49152])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradient_match_the_plain_computation(vocab, temperature):
    gen = torch.Generator().manual_seed(vocab)
    x = (torch.randn(3, 5, vocab, generator=gen) * 4).requires_grad_(True)
    labels = torch.randint(vocab, (3, 5), generator=gen)
    g = torch.randn(3, 5, generator=gen)
    lp, ent = token_logprobs_and_entropy(x, labels, temperature, entropy=True)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == labels.shape
    assert not ent.requires_grad
    ref_lp, ref_ent = _plain64(x.detach(), labels, temperature)
    tol = _scale_tol(x, temperature)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=tol)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=tol)
    (lp * g).sum().backward()

    x64 = x.detach().double().requires_grad_(True)
    (torch.log_softmax(x64 / temperature, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1) * g.double()).sum() \
        .backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=0, atol=tol * float(g.abs().max()) / temperature)

    # and the float32 functions it replaces, at the same tolerance
    x32 = x.detach().clone().requires_grad_(True)
    plain = logprobs_from_logits(x32 / temperature, labels)
    (plain * g).sum().backward()
    torch.testing.assert_close(lp, plain, rtol=0, atol=tol)
    torch.testing.assert_close(ent, entropy_from_logits(x.detach() / temperature), rtol=0, atol=tol)
    torch.testing.assert_close(x.grad, x32.grad, rtol=0, atol=tol * float(g.abs().max()) / temperature)


def test_many_chunks_and_a_strided_view_give_the_one_chunk_numbers(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(4, 7, 300, generator=gen) * 3
    labels = torch.randint(300, (4, 6), generator=gen)
    g = torch.randn(4, 6, generator=gen)
    results = []
    for chunk in (1 << 22, 300 * 5, 1):  # one chunk; 5 rows; a row at a time (the strided view: whole first rows)
        monkeypatch.setattr(loss_module, "_CHUNK_ELEMENTS", chunk)
        x = full.clone().requires_grad_(True)
        view = x[:, :-1]  # not contiguous, as response_logits returns
        lp, ent = token_logprobs_and_entropy(view, labels, 1.3, entropy=True)
        (lp * g).sum().backward()
        results.append((lp, ent, x.grad))
    for lp, ent, grad in results[1:]:
        tol = _scale_tol(full, 1.3)
        torch.testing.assert_close(lp, results[0][0], rtol=0, atol=tol)
        torch.testing.assert_close(ent, results[0][1], rtol=0, atol=tol)
        torch.testing.assert_close(grad, results[0][2], rtol=0, atol=tol * float(g.abs().max()))
    assert bool((results[0][2][:, -1] == 0).all())  # the position left out of the view gets no gradient


def test_bf16_logits_get_a_bf16_gradient_equal_to_the_upcast_computation():
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 3, 49152, generator=gen) * 3).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(49152, (2, 3), generator=gen)
    lp, _ = token_logprobs_and_entropy(x, labels)
    assert lp.dtype == torch.float32
    lp.sum().backward()
    assert x.grad.dtype == torch.bfloat16
    x2 = x.detach().clone().requires_grad_(True)
    logprobs_from_logits(x2.float(), labels).sum().backward()
    tol = _scale_tol(x.float(), 1.0)
    torch.testing.assert_close(lp, logprobs_from_logits(x.detach().float(), labels), rtol=0, atol=tol)
    # both round the same float32 gradient to bf16: at most one bf16 step apart
    diff = (x.grad.float() - x2.grad.float()).abs()
    assert bool((diff <= x2.grad.float().abs() * 2 ** -7 + tol).all())


def test_banned_tokens_are_finite_and_get_no_gradient():
    x = torch.randn(2, 10).requires_grad_(True)
    banned = torch.zeros(2, 10, dtype=torch.bool)
    banned[:, 5:] = True
    logits = x.masked_fill(banned, float("-inf"))
    labels = torch.tensor([1, 4])
    lp, ent = token_logprobs_and_entropy(logits, labels, entropy=True)
    assert bool(torch.isfinite(lp).all()) and bool(torch.isfinite(ent).all())
    lp.sum().backward()
    assert bool(torch.isfinite(x.grad).all()) and bool((x.grad[:, 5:] == 0).all())
    torch.testing.assert_close(ent, entropy_from_logits(logits.detach()))


def test_without_entropy_and_without_grad():
    x = torch.randn(4, 50)
    labels = torch.randint(50, (4,))
    lp, ent = token_logprobs_and_entropy(x, labels)
    assert ent is None and not lp.requires_grad
    torch.testing.assert_close(lp, logprobs_from_logits(x, labels))
    with pytest.raises(ValueError, match="labels shape"):
        token_logprobs_and_entropy(x, labels[:2])
