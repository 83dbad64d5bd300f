"""The AbsTopK SAE (sae-lens' AbsTopKSAE; "AbsTopK: Rethinking Sparse Autoencoders For Bidirectional
Features", arXiv:2510.00404): the k pre-activations of largest magnitude, with their sign, no ReLU.

    h = (x - b_dec) @ W_enc + b_enc          (times ||W_dec[i]|| with rescale_acts_by_decoder_norm)
    f = h on the k entries of largest |h|, 0 elsewhere       (a feature fires either way: f_i != 0)

Training (sae-lens' AbsTopKTrainingSAE): MSE plus TopK's AuxK loss, its dead features also chosen by
magnitude and kept signed. Everything else is TopK's (topk.py): the folded-bias encoder, the
`embedding_bag` decoder, the dead-feature accounting (a feature fired when its activation was non-zero),
unit decoder rows at the start and, by default, throughout (sae-lens starts them at norm 0.1 and leaves
them free: `normalize_decoder=False`). `rescale_acts_by_decoder_norm` is False by default as in
sae-lens' inference config (its training config defaults to True; set it on the SAE to train that
way: the ranking then ignores the decoder rows' norms, and the saved inference form folds them into the
weights). sae-lens' `use_sparse_activations` is ignored by AbsTopK there, and has no counterpart here.

Example:
    >>> sae = SAE(SAEConfig(d_in=64, d_sae=256, architecture="abstopk", k=8,
    ...                     metadata={"hook_name": "blocks.1.hook_resid_pre"}))
    >>> bool((sae.encode(torch.randn(3, 64)) < 0).any())     # negative activations too
    True
"""

from __future__ import annotations

from typing import ClassVar

from .topk import TopK

__all__ = ["AbsTopK"]


class AbsTopK(TopK):
    """k features per token by |pre-activation|, signed (sae-lens' "abstopk")."""

    name: ClassVar[str] = "abstopk"
    by_magnitude: ClassVar[bool] = True  # rank by |h|, keep the sign (also in AuxK's choice of dead features)
