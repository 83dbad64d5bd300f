"""Transcoder metrics (`evaluate_transcoders`), with the SAE's definitions per output layer:
* explained variance of the MLP output: `1 - sum ||y - y_hat||^2 / sum ||y - mean(y)||^2` (per layer);
* MSE: mean over tokens of the summed squared error (per layer; `mse` sums the layers, as the loss);
* L0: mean number of active features per token (per layer; `l0` is their mean);
* dead fraction: features that never fire on these tokens;
* CE loss recovered: `(CE_zero_ablation - CE_spliced) / (CE_zero_ablation - CE_clean)`, where every
  output hook the set writes (`blocks.L.hook_mlp_out`) is replaced at once, without an error term: by
  zeros (zero ablation) or by the transcoders' predictions from that run's own inputs (spliced through
  `model.transcoders(...)`: a CLT's layer m from the features of layers 0..m of that run).
The first four are measured on the clean run's activations, as the splice reads them (a transcoder made for
other weights, or reading mlp.hook_in, mapped onto the model's exactly as spliced: the metrics are the splice's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..common import ce_batches, ce_metrics, check_eval_inputs
from .clt import CrossLayerTranscoder
from .processing import Plan, apply_input, apply_output
from .transcoder import Transcoder, fit_plan

__all__ = ["evaluate_transcoders", "transcoder_set"]

_SHARED = ("architecture", "d_in", "d_sae", "d_out", "k", "skip", "nonnegative_acts")


def transcoder_set(
    transcoders: Any, caller: str, arg: str = "transcoders"
) -> tuple[nn.Module, list[Transcoder], CrossLayerTranscoder | None]:
    """(one module holding every parameter, the PLTs in order, the CLT or None) of a Transcoder, a list of
    Transcoders (one per layer, same architecture and widths) or a CrossLayerTranscoder."""
    if isinstance(transcoders, CrossLayerTranscoder):
        return transcoders, [], transcoders
    if isinstance(transcoders, Transcoder):
        return transcoders, [transcoders], None
    if not isinstance(transcoders, (list, tuple, nn.ModuleList)) or len(transcoders) == 0:
        raise TypeError(
            f"{caller}: {arg}: expected a Transcoder, a non-empty list of them (one per layer) or a "
            f"CrossLayerTranscoder, got {type(transcoders).__name__}"
        )
    tcs = list(transcoders)
    for i, tc in enumerate(tcs):
        if not isinstance(tc, Transcoder):
            raise TypeError(f"{caller}: {arg}[{i}]: expected a Transcoder, got {type(tc).__name__}")
        for name in _SHARED:
            if getattr(tc.cfg, name) != getattr(tcs[0].cfg, name):
                raise ValueError(
                    f"{caller}: {arg}[{i}].cfg.{name}={getattr(tc.cfg, name)!r} but {arg}[0]'s is "
                    f"{getattr(tcs[0].cfg, name)!r}: a set trained or evaluated together shares it"
                )
    layers = [tc.layer for tc in tcs]
    twice = sorted({x for x in layers if x is not None and layers.count(x) > 1})
    if twice:
        raise ValueError(f"{caller}: {arg}: layers {twice} are given twice; pass one transcoder per layer")
    return nn.ModuleList(tcs), tcs, None


def _splice_maps(
    model: Any, tcs: list[Transcoder], clt: CrossLayerTranscoder | None, caller: str
) -> tuple[list[tuple[str, str]], list[Plan | None]]:
    """Each part's (read hook, write hook) and map onto the model's weights, as the splice takes them
    (`splice_hooks`: the same checks, mlp.hook_in read at ln2.hook_normalized, a transcoder made for
    other weights mapped exactly or refused by name), so that the metrics are those of what is spliced."""
    if clt is not None:
        n = model.cfg.n_layers
        if clt.n_layers > n:
            raise ValueError(f"{caller}: the CLT has {clt.n_layers} layers but the model {n} (layers 0..{n - 1})")
        for field, width in (("d_in", clt.cfg.d_in), ("d_out", clt.cfg.d_out)):
            if width != model.cfg.d_model:
                raise ValueError(
                    f"{caller}: the CLT's {field}={width} does not fit the model's d_model={model.cfg.d_model}"
                )
    parts: list[Any] = list(clt.splice_parts()) if clt is not None else list(tcs)
    pairs, plans = [], []
    for i, part in enumerate(parts):
        arg = "the CrossLayerTranscoder" if clt is not None else f"transcoders[{i}]"
        plan = fit_plan(model, part, caller=caller, arg=arg)
        read, write = part.input_hook, part.output_hook
        if read is None or write is None:
            raise ValueError(
                f"{caller}: {arg}: cfg.metadata.hook_name (the input) and hook_name_out (the output) must both be "
                f"set, got {read!r} and {write!r}"
            )
        if plan is not None and plan.read_hook:
            read = plan.read_hook
        model.hook_points([read, write], arg=f"{arg}: cfg.metadata.hook_name / hook_name_out")
        pairs.append((read, write))
        plans.append(None if plan is None or plan.identity else plan)
    return pairs, plans


@torch.no_grad()
def evaluate_transcoders(model: Any, transcoders: Any, tokens: Tensor, batch_size: int = 32) -> dict[str, Any]:
    """The metrics of a set of transcoders on `tokens` `[batch, pos]` (see the module's docs): per layer
    (lists in the order of `layers`) explained_variance_per_layer, mse_per_layer, l0_per_layer,
    dead_fraction_per_layer; over the set explained_variance (the layers' mean), mse (their sum), l0
    (their mean), dead_fraction (of all features); ce_clean, ce_spliced, ce_zero_ablation,
    ce_loss_recovered, n_tokens. Every position counts (BOS too, as evaluate_sae).

    Example:
        >>> evaluate_transcoders(model, load_transcoders("transcoders/tiny-gpt2"), val_tokens)["ce_loss_recovered"]
        0.9
    """
    caller = "evaluate_transcoders"
    _, tcs, clt = transcoder_set(transcoders, caller)
    tokens, batch_size = check_eval_inputs(model, tokens, batch_size, caller)
    pairs, plans = _splice_maps(model, tcs, clt, caller)
    if clt is not None:
        layers = list(range(clt.n_layers))
        d_sae, dtype, device = clt.cfg.d_sae, clt.dtype, clt.device
    else:
        layers = [tc.layer if tc.layer is not None else i for i, tc in enumerate(tcs)]
        d_sae, dtype, device = tcs[0].d_sae, tcs[0].dtype, tcs[0].device
    n_set = len(pairs)
    names = [h for pair in pairs for h in pair]
    ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    sse, y_sum, y_sq = [0.0] * n_set, [0.0] * n_set, [0.0] * n_set
    y_total: list[Tensor | None] = [None] * n_set
    l0_sum, n_rows = [0.0] * n_set, 0
    fired = torch.zeros(n_set, d_sae, dtype=torch.bool, device=device)

    def splice() -> Any:
        return model.transcoders(tcs if clt is None else clt)

    for cache in ce_batches(model, tokens, batch_size, names, splice, [b for _, b in pairs], ce):
        xs = torch.stack([cache[a].reshape(-1, cache[a].shape[-1]) for a, _ in pairs]).to(device, dtype)
        ys = torch.stack([cache[b].reshape(-1, cache[b].shape[-1]) for _, b in pairs]).to(device, dtype)
        xs = torch.stack([apply_input(xs[j], plans[j]) for j in range(n_set)])  # what the splice reads
        if clt is not None:
            acts = clt.encode(xs)
            y_hat = clt.decode(acts, xs if clt.cfg.skip else None)
        else:
            acts = torch.stack([tc.encode(xs[j]) for j, tc in enumerate(tcs)])
            y_hat = torch.stack([tc.decode(acts[j], xs[j]) for j, tc in enumerate(tcs)])
        y_hat = torch.stack([apply_output(y_hat[j], plans[j]) for j in range(n_set)])  # what it writes
        fired |= (acts != 0).any(1)
        for j in range(n_set):
            y = ys[j].double()
            sse[j] += float((y - y_hat[j].double()).pow(2).sum())
            y_sq[j] += float(y.pow(2).sum())
            y_total[j] = y.sum(0) if y_total[j] is None else y_total[j] + y.sum(0)  # type: ignore[operator]
            l0_sum[j] += float((acts[j] != 0).sum())
        n_rows += xs.shape[1]
    for j in range(n_set):
        total = y_total[j]
        assert total is not None
        y_sum[j] = y_sq[j] - float(total.pow(2).sum()) / n_rows  # sum ||y - mean||^2
    ev = [1 - sse[j] / y_sum[j] for j in range(n_set)]
    l0 = [l0_sum[j] / n_rows for j in range(n_set)]
    return {
        "layers": layers,
        "explained_variance_per_layer": ev,
        "mse_per_layer": [sse[j] / n_rows for j in range(n_set)],
        "l0_per_layer": l0,
        "dead_fraction_per_layer": [float((~fired[j]).float().mean()) for j in range(n_set)],
        "explained_variance": sum(ev) / n_set,
        "mse": sum(sse) / n_rows,
        "l0": sum(l0) / n_set,
        "dead_fraction": float((~fired).float().mean()),
        **ce_metrics(ce, n_rows),
    }
