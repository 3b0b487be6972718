"""hacking/repeated_ngram_share on hand-made responses."""

from __future__ import annotations

import torch

from klguard.ppo.metrics import repeated_ngram_share


def test_repeated_ngram_share():
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 0],   # 7 tokens: 5 trigrams, 2 of them repeats
                        [4, 5, 6, 7, 0, 0, 0, 0],   # 2 trigrams, none repeated
                        [9, 9, 0, 0, 0, 0, 0, 0]])  # shorter than a trigram: 0
    mask = torch.tensor([[1] * 7 + [0], [1] * 4 + [0] * 4, [1] * 2 + [0] * 6])
    # row 0 trigrams: 123 231 312 123 231 -> 3 distinct of 5 -> 0.4
    assert abs(repeated_ngram_share(ids, mask) - (0.4 + 0 + 0) / 3) < 1e-12
    loop = torch.tensor([[7] * 8])  # one token looping: 6 trigrams, 1 distinct
    assert abs(repeated_ngram_share(loop, torch.ones_like(loop)) - 5 / 6) < 1e-12
    assert repeated_ngram_share(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4)) == 0.0
