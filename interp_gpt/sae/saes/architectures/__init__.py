"""Every SAE architecture, one small module each, by sae-lens' name.

    standard              ReLU, decoder-norm-weighted L1                      (standard.py)
    topk                  the k largest pre-activations per token              (topk.py)
    jumprelu              ReLU above a learned threshold                       (jumprelu.py)
    batchtopk             k per token on average over the batch; saved as
                          jumprelu with its running threshold                  (batchtopk.py)
    matryoshka_batchtopk  BatchTopK whose nested prefixes each reconstruct;
                          saved as jumprelu                                    (matryoshka.py)
    gated                 a gate and a magnitude from one encoder              (gated.py)
    abstopk               the k largest |pre-activations|, signed              (abstopk.py)
    matching_pursuit      greedy tied decoder rows, one at a time, until the
                          residual is small                                    (matching_pursuit.py)
    temporal              attention over earlier positions predicts a code, a
                          sparse novel code does the rest                      (temporal.py; inference only)

`get_architecture(name)` returns one; `ARCHITECTURES` lists them in order.

Example:
    >>> get_architecture("topk").fields
    {'k': 100, 'rescale_acts_by_decoder_norm': False}
"""

from __future__ import annotations

import difflib

from .abstopk import AbsTopK
from .base import Architecture
from .batchtopk import BatchTopK
from .gated import Gated
from .jumprelu import JumpReLU
from .matching_pursuit import MatchingPursuit
from .matryoshka import MatryoshkaBatchTopK
from .standard import Standard
from .temporal import Temporal
from .topk import TopK

__all__ = ["Architecture", "ARCHITECTURES", "REGISTRY", "get_architecture", "FIELD_OWNERS"]

REGISTRY: dict[str, Architecture] = {
    a.name: a
    for a in (
        Standard(),
        TopK(),
        JumpReLU(),
        BatchTopK(),
        MatryoshkaBatchTopK(),
        Gated(),
        AbsTopK(),
        MatchingPursuit(),
        Temporal(),
    )  # fmt: skip
}
ARCHITECTURES = tuple(REGISTRY)
# config field -> the architectures that own it
FIELD_OWNERS: dict[str, tuple[str, ...]] = {}
for _arch in REGISTRY.values():
    for _field in _arch.fields:
        FIELD_OWNERS[_field] = (*FIELD_OWNERS.get(_field, ()), _arch.name)


def get_architecture(name: str) -> Architecture:
    """The architecture called `name` (sae-lens' name); an unknown one is refused with the close names."""
    arch = REGISTRY.get(name) if isinstance(name, str) else None
    if arch is None:
        close = difflib.get_close_matches(str(name), ARCHITECTURES, n=2)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"architecture={name!r} is not supported{hint}; expected one of {', '.join(ARCHITECTURES)}")
    return arch
