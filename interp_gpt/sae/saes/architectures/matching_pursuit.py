"""The matching-pursuit SAE (sae-lens' MatchingPursuitSAE): a tied SAE whose encoder picks decoder rows
one at a time, greedily, each time the row most aligned with what is left of the input.

    r = x - b_dec                                  (x itself without apply_b_dec_to_input)
    repeat up to max_iterations (None: d_in) times, for every row not yet done:
        i = argmax_j ReLU(r . W_dec[j])            (feature 0 when no r . W_dec[j] is > 0)
        v = ReLU(r . W_dec[i]);  f_i += v;  r -= v * W_dec[i]
        done when the support did not change (stop_on_duplicate_support: i was already chosen, or v = 0)
        or when ||r|| < residual_threshold (if > 0); stop as soon as every row is done
    x_hat = f @ W_dec + b_dec                      (no b_dec without apply_b_dec_to_input)

It holds `W_dec` and `b_dec` only: `sae.W_enc` is `W_dec.T`, as in sae-lens. There is no single
pre-activation, so `hook_sae_acts_pre` does not run (as in sae-lens); `hook_sae_acts_post` does, as for
every other architecture here (sae-lens' MatchingPursuitSAE skips it, so a hook there would do nothing).
The loop runs over iterations, each over every row still running at once (finished rows drop out).

Training (sae-lens' MatchingPursuitTrainingSAE): the MSE alone (no auxiliary term), its gradient through
every chosen value and row (`x_hat = x - r`, the residual left at the end); decoder rows start at unit
norm and are free after (as in sae-lens; `normalize_decoder=True` keeps them unit-norm).

Example:
    >>> sae = SAE(SAEConfig(d_in=64, d_sae=256, architecture="matching_pursuit", max_iterations=16,
    ...                     metadata={"hook_name": "blocks.1.hook_resid_pre"}))
    >>> feats = sae.encode(torch.randn(3, 64))           # [3, 256], at most 16 non-zero per row
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from .base import Architecture

__all__ = ["MatchingPursuit", "matching_pursuit", "gram_of", "GRAM_MAX_BYTES"]


class MatchingPursuit(Architecture):
    """Greedy, tied encoding (sae-lens' "matching_pursuit")."""

    name: ClassVar[str] = "matching_pursuit"
    fields: ClassVar[dict[str, Any]] = {  # sae-lens' defaults
        "residual_threshold": 1e-2,
        "max_iterations": None,
        "stop_on_duplicate_support": True,
    }

    def shapes(self, cfg: Any) -> dict[str, tuple[int, ...]]:
        return {"W_dec": (cfg.d_sae, cfg.d_in), "b_dec": (cfg.d_in,)}

    def derived_tensor(self, sae: Any, name: str) -> Tensor | None:
        return sae.W_dec.T if name == "W_enc" else None  # tied: sae-lens' W_enc is W_dec.T

    def check_config(self, cfg: Any) -> None:
        t = cfg.residual_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"residual_threshold={t!r}: expected a finite number >= 0 (0: no threshold)")
        cfg.residual_threshold = float(t)
        m = cfg.max_iterations
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_iterations={m!r}: expected an integer >= 1, or None (d_in)")
        if not isinstance(cfg.stop_on_duplicate_support, bool):
            raise TypeError(f"stop_on_duplicate_support={cfg.stop_on_duplicate_support!r}: expected JSON true or false")

    # ----- inference ----------------------------------------------------------------------
    def encode(self, sae: Any, x: Tensor, hp: dict[str, Any]) -> Tensor:
        acts, _ = self._pursue(sae, x)
        return acts

    def decode(self, sae: Any, feature_acts: Tensor) -> Tensor:
        out = feature_acts @ sae.W_dec
        return out + sae.b_dec if sae.cfg.apply_b_dec_to_input else out  # tied: b_dec only if taken off

    def _pursue(self, sae: Any, x: Tensor, gram: Tensor | None = None) -> tuple[Tensor, Tensor]:
        c = sae.cfg
        sae_in = x - sae.b_dec * c.apply_b_dec_to_input
        return matching_pursuit(
            sae_in, sae.W_dec, c.residual_threshold, c.max_iterations, c.stop_on_duplicate_support, gram
        )

    # ----- training -----------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, trainer: Any, x: Tensor) -> None:
        """sae-lens': random unit decoder rows (its decoder_init_norm is forced to 1); b_dec the first
        batch's mean (our `init_b_dec_to_mean`) or 0."""
        sae, gen = trainer.sae, torch.Generator().manual_seed(trainer.cfg.seed)
        w = torch.randn(sae.W_dec.shape, generator=gen, dtype=torch.float32)
        sae.W_dec.copy_(w / w.norm(dim=-1, keepdim=True))
        sae.b_dec.copy_(x.mean(0) if trainer.cfg.init_b_dec_to_mean else torch.zeros_like(sae.b_dec))

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The MSE, `||r||^2` of the residual the pursuit leaves (`x - x_hat`). The choices follow the
        correlations updated through the decoder's Gram matrix (`gram_of`), where it fits in memory."""
        sae = trainer.sae
        acts, residual = self._pursue(sae, x, gram_of(sae.W_dec, sae.cfg.max_iterations, x.shape[0]))
        mse = residual.pow(2).sum(-1).mean()
        return mse, {"mse": mse, "feats": acts.detach(), "x_hat": (x - residual).detach()}


# The Gram matrix W_dec @ W_dec.T is used for the choices while it takes at most this many bytes.
GRAM_MAX_BYTES = 1 << 29


@torch.no_grad()
def gram_of(w_dec: Tensor, max_iterations: int | None, n_rows: int) -> Tensor | None:
    """`W_dec @ W_dec.T` `[d_sae, d_sae]` when the pursuit's choices are cheaper through it: its product costs
    d_sae^2 * d_in once, after which each iteration's correlations are updated with one of its rows per input
    row (n * d_sae) rather than recomputed (n * d_sae * d_in); None when it would exceed `GRAM_MAX_BYTES`
    or when too few iterations run to repay it."""
    d_sae, d_in = w_dec.shape
    iterations = d_in if max_iterations is None else max_iterations
    if d_sae * d_sae * w_dec.element_size() > GRAM_MAX_BYTES or iterations * n_rows < 2 * d_sae:
        return None
    return w_dec @ w_dec.T


def matching_pursuit(
    sae_in: Float[Tensor, "... d_in"],
    W_dec: Float[Tensor, "d_sae d_in"],
    residual_threshold: float,
    max_iterations: int | None,
    stop_on_duplicate_support: bool,
    gram: Tensor | None = None,
) -> tuple[Float[Tensor, "... d_sae"], Float[Tensor, "... d_in"]]:
    """(feature activations, residual left) of matching pursuit on `sae_in` (already less b_dec), as
    sae-lens' `_encode_matching_pursuit`; differentiable in the values and rows it chooses. With `gram`
    (`W_dec @ W_dec.T`, see `gram_of`) the correlations `r . W_dec[j]` that pick each row are updated
    (`c -= v * gram[i]`) rather than recomputed: equal up to float rounding (a near-tie may pick the
    other row), at n * d_sae rather than n * d_sae * d_in work an iteration. The values, the residual
    and their gradients are computed exactly either way.

    Example:
        >>> acts, r = matching_pursuit(torch.randn(5, 8), torch.randn(32, 8), 1e-2, None, True)
    """
    d_sae, d_in = W_dec.shape
    lead = sae_in.shape[:-1]
    residual = sae_in.reshape(-1, d_in)
    n = residual.shape[0]
    acts = residual.new_zeros(n, d_sae)
    by_norm = residual_threshold > 0
    stops = stop_on_duplicate_support or by_norm
    rows = torch.arange(n, device=residual.device)  # the rows still running, and `residual` theirs
    corr = None
    if gram is not None:
        with torch.no_grad():
            corr = residual @ W_dec.T  # [rows, d_sae], kept up to date through gram
    finished: list[tuple[Tensor, Tensor]] = []  # (rows, their last residual) of the rows done
    for _ in range(d_in if max_iterations is None else max_iterations):
        if not rows.numel():
            break
        with torch.no_grad():  # the choice: no gradient, and no [rows, d_sae] product kept for backward
            best, index = (residual @ W_dec.T if corr is None else corr).max(dim=-1)
            index = torch.where(best > 0, index, 0)  # sae-lens' argmax of the ReLU'd: 0 when none is > 0
            unseen = acts[rows, index] == 0
        atom = W_dec[index]  # [rows, d_in]
        value = (residual * atom).sum(-1).relu()
        acts.index_put_((rows, index), value, accumulate=True)
        residual = residual - value[:, None] * atom
        if corr is not None and gram is not None:
            with torch.no_grad():
                corr -= value.detach()[:, None] * gram.index_select(0, index)
        if not stops:
            continue
        with torch.no_grad():
            done = torch.zeros_like(unseen)
            if stop_on_duplicate_support:  # the support grew only if the feature is new and its value > 0
                done |= ~(unseen & (value > 0))
            if by_norm:
                done |= residual.norm(dim=-1) < residual_threshold
            n_done = int(done.sum())  # one sync an iteration (sae-lens': done.all())
        if n_done:
            finished.append((rows[done], residual[done]))
            rows, residual = rows[~done], residual[~done]
            if corr is not None:
                corr = corr[~done]
    if finished:  # put each row's residual back in its place
        order = torch.cat([r for r, _ in finished] + [rows])
        left = torch.cat([res for _, res in finished] + [residual])
        residual = left.new_empty(n, d_in).index_put_((order,), left)
    return acts.reshape(*lead, d_sae), residual.reshape(*lead, d_in)
