"""bench/device.py's `attribution` part (issue 39): attribution graphs on the device, fp32 and bf16.

The model is device.py's checkpoint loaded raw (`from_pretrained_no_processing`: the transcoders read
`ln2.hook_normalized` and write `hook_mlp_out` unprocessed, as circuit-tracer's GPT-2 transcoders do);
one TopK(16) transcoder per layer of width 24,576 (the public GPT-2 transcoders' width; 512 with --quick),
random, float32 (attribute reads float32 transcoders on a bfloat16 model); a prompt of 16 random tokens
(8 with --quick). Timed: `attribute` at each batch size (attribute's device default 128 and circuit-
tracer's 512), every feature a node, and at 128 tokens with max_feature_nodes 512 (a long prompt); each
row's peak memory and feature count. Checks: the bf16 graph's adjacency against the fp32 one's (relative
to its scale: information only, bf16 carries 3 digits), and the estimate (`estimate_memory`) against the
measured peak (on the CPU the work over the weights against the RSS increase; on CUDA the parts it puts
on the device against torch's peak allocated bytes over the weights).

Run it through device.py (`bash bench/device.sh --parts attribution`); this file holds only the part.
"""

from __future__ import annotations

from typing import Any

import torch


def attribution(bench: Any, name: str, dtype: torch.dtype) -> dict[str, Any]:
    """The part: rows of (case, time, peak memory, features), the checks, the fp32 graph kept for bf16's."""
    from attribution_memory import make_transcoders  # bench/ is on the path (device.py puts it there)

    from interp_gpt.attribution import attribute, estimate_memory

    quick = bench.shapes.quick
    model = bench.ours(dtype, processed=False)
    width = 512 if quick else 24576
    tcs = [tc.to(model.W_E.device) for tc in make_transcoders(model, width, 16)]
    n_tokens, long = (8, 24) if quick else (16, 128)
    prompt = bench.tokens(1, n_tokens, seed=3)[0]
    rows: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    cases = [(f"{n_tokens} tokens, batch {b}", prompt, b, None) for b in (128, 512)]
    cases.append((f"{long} tokens, batch 128, max_feature_nodes 512", bench.tokens(1, long, seed=4)[0], 128, 512))
    for case, tokens, batch, nodes in cases:
        kw = {"batch_size": batch, "max_feature_nodes": nodes, "check_memory": False}
        r = bench.timed({case: lambda tokens=tokens, kw=kw: attribute(model, tokens, tcs, **kw)})
        graph = attribute(model, tokens, tcs, **kw)
        est = estimate_memory(model, tcs, tokens.shape[0], batch_size=batch, max_feature_nodes=nodes)
        measured = r["peak_memory_increase"][case]
        on_device = est.on_device() if str(est.device).startswith("cuda") else est.work
        ratio = on_device / measured if measured > 2**20 else None  # under a MiB: not measured (RSS pages)
        r.update(n_features=int(graph.active_features.shape[0]), estimate=on_device, estimate_ratio=ratio)
        shown = "n/a (under 1 MiB measured)" if ratio is None else f"{ratio:.2f}"
        detail = f"{on_device / 2**20:.0f} / {measured / 2**20:.0f} MiB = {shown}"
        bench.check(f"attribution {name} {case}: estimate / measured peak", True, detail, required=False)
        rows[case] = r
        graphs[case] = (graph.selected_features.cpu(), graph.adjacency_matrix.to_dense().float().cpu())
    kept = getattr(bench, "_attribution_fp32", None)
    if dtype == torch.float32:
        bench._attribution_fp32 = graphs
    elif kept is not None:
        for case, (selected, adjacency) in graphs.items():
            ref_selected, ref = kept[case]
            if ref.shape != adjacency.shape or not torch.equal(selected, ref_selected):
                detail = "other features selected (bf16's rounding reorders the influences): not compared"
            else:
                rel = float((adjacency - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
                detail = f"max |diff| / scale {rel:.2e}"
            bench.check(f"attribution {name} vs fp32, {case}", True, detail, required=False)
    return rows
