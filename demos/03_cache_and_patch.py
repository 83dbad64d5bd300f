# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Caches, hooks, activation patching and attribution patching
#
# The transformer-lens workflow, on a task every model with an induction head can do:
# predicting the second copy of a repeated random sequence.
#
# 1. `run_with_cache` and the `ActivationCache`;
# 2. the task, and which components write the answer (direct logit attribution);
# 3. ablating heads with `run_with_hooks` (zeroing `hook_z`);
# 4. activation patching sweeps (`patching.get_act_patch_*`, as in
#    `transformer_lens.patching`, batched);
# 5. attribution patching, and how well it agrees with real patching.

# %%
MODEL_NAME = "tiny-gpt2"  # or "gpt2" (needs the Hugging Face hub)

# %% [markdown]
# The model: `"tiny-gpt2"` ships inside the package (2 layers, 4 heads, d_model 128,
# a 2048-token byte-level BPE, trained on Shakespeare and War and Peace) and loads with
# no network. Set `MODEL_NAME = "gpt2"` to run everything on GPT-2 small instead (it is
# downloaded through the Hugging Face hub and its cache). Nothing below depends on
# which model it is: layers and heads are found from the model's own numbers.

# %%
from functools import partial

import plotly.graph_objects as go
import torch

from interp_gpt import GPT, get_act_name, patching, plots
from interp_gpt.inspect import head_scores, repeated_tokens
from interp_gpt.metrics import logits_to_ave_logit_diff, normalized_logit_diff

torch.set_grad_enabled(False)  # attribution_patch turns gradients on for itself
model = GPT.from_pretrained(MODEL_NAME)
n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads

# %% [markdown]
# ## 1 · `run_with_cache` and the cache
#
# `run_with_cache` returns the logits and an `ActivationCache` keyed by
# transformer-lens' hook names. It takes the same short keys: `cache["pattern", 0]`
# is `cache["blocks.0.attn.hook_pattern"]`, `cache["resid_pre", 1]`, `cache["z", 1]`,
# `cache["scale", 0, "ln1"]`.

# %%
PROMPT = "Well, Prince, so Genoa and Lucca are now just family estates of the Buonapartes."
logits, cache = model.run_with_cache(PROMPT)
print(len(cache), "cached activations, e.g.", list(cache.keys())[:6])
print("pattern, layer 0:   ", tuple(cache["pattern", 0].shape), "[batch, head, query_pos, key_pos]")
print("same tensor:        ", cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"])
print("z, layer 1:         ", tuple(cache["z", 1].shape), "[batch, pos, head, d_head]")
print("resid_pre, layer 1: ", tuple(cache["resid_pre", 1].shape), "[batch, pos, d_model]")
print("ln1 scale, layer 0: ", tuple(cache["scale", 0, "ln1"].shape))

# %% [markdown]
# Each pattern row sums to 1 over the keys, and is 0 above the diagonal (causal
# mask). The cache also decomposes the residual stream, with transformer-lens' method
# names: `decompose_resid` splits it into what wrote it, and the pieces add up to it.

# %%
pattern = cache["pattern", 0]
print("rows sum to 1:", torch.allclose(pattern.sum(-1), torch.ones_like(pattern[..., 0])))
print("causal:       ", bool((pattern.triu(1) == 0).all()))

parts, labels = cache.decompose_resid(layer=n_layers, return_labels=True)
print(labels)
print("sum of parts == final residual:", torch.allclose(parts.sum(0), cache["resid_post", n_layers - 1], atol=1e-4))

# %% [markdown]
# `names_filter` caches only what you ask for (a name, a list, or a function of the
# name), and with `return_type=None` the forward pass stops after the last layer it
# needs.

# %%
_, small_cache = model.run_with_cache(PROMPT, names_filter=lambda name: name.endswith("hook_pattern"), return_type=None)
list(small_cache.keys())

# %% [markdown]
# ## 2 · The task: repeated random tokens
#
# - **clean**: `BOS A A[:STOP]`, where `A` is `SEQ_LEN` random tokens. The next token
#   is `A[STOP]`, which can only be known by finding the earlier `A[STOP-1]` and
#   copying what came after it: an induction head's job.
# - **corrupted**: `BOS A' A[:STOP]`, the first copy replaced by other random tokens
#   `A'`. The prompt ends the same way, but there is nothing to copy from.
# - **answers**: `[batch, 2]` as in the IOI convention, column 0 correct (`A[STOP]`),
#   column 1 wrong: `A'[STOP]`, the token at the same place in the corrupted first
#   half (in the context of the corrupted prompt, not of the clean one).
# - **metric**: the logit difference at the last position, averaged over the batch
#   (`metrics.logits_to_ave_logit_diff`), and normalised
#   (`metrics.normalized_logit_diff`) so that the corrupted run scores 0 and the clean
#   run 1.
#
# `repeated_tokens` draws the random sequences as transformer-lens' induction evals
# do (seeded).

# %%
SEQ_LEN, STOP, N_PROMPTS = 20, 10, 8
clean_full = repeated_tokens(model, seq_len=SEQ_LEN, batch_size=N_PROMPTS, seed=0)  # BOS A A
other_full = repeated_tokens(model, seq_len=SEQ_LEN, batch_size=N_PROMPTS, seed=1)  # BOS A' A'
corrupted_full = clean_full.clone()
corrupted_full[:, 1 : 1 + SEQ_LEN] = other_full[:, 1 : 1 + SEQ_LEN]  # BOS A' A

n_pos = 1 + SEQ_LEN + STOP  # the prompts end at the second copy of A[STOP - 1]
clean_tokens, corrupted_tokens = clean_full[:, :n_pos], corrupted_full[:, :n_pos]
answers = torch.stack([clean_full[:, n_pos], other_full[:, 1 + STOP]], dim=1)  # [batch, 2]
# One label per position (the tokens differ from prompt to prompt).
position_labels = ["BOS"] + [f"A{i}" for i in range(SEQ_LEN)] + [f"A{i}" for i in range(STOP)]
print(clean_tokens.shape, answers.shape)
print("clean prompt 0:    ", model.to_str_tokens(clean_tokens[0])[-6:], "->", model.to_str_tokens(answers[0, :1]))
print("corrupted prompt 0:", model.to_str_tokens(corrupted_tokens[0])[-6:])

# %% [markdown]
# Run both: the clean run with a full cache (the patching below reads the clean
# activations from it), the corrupted one for its logits. Then the logit differences,
# and the normalised metric the patching functions will call on each patched run.
# The normalisation divides by (clean - corrupted): if the two are close (a model
# without an induction head), the patching maps below are mostly noise.

# %%
clean_logits, clean_cache = model.run_with_cache(clean_tokens)
corrupted_logits = model(corrupted_tokens)
clean_ld = logits_to_ave_logit_diff(clean_logits, answers)
corrupted_ld = logits_to_ave_logit_diff(corrupted_logits, answers)
print(f"logit difference: clean {clean_ld:.3f}, corrupted {corrupted_ld:.3f}")
print("per prompt (clean):", logits_to_ave_logit_diff(clean_logits, answers, per_prompt=True))

metric = normalized_logit_diff(answers, clean_logits, corrupted_logits)
print(f"normalised metric: clean {metric(clean_logits):.3f}, corrupted {metric(corrupted_logits):.3f}")


# %% [markdown]
# The loss tells the same story on the full sequences: on the second copy of `A`
# a model that copies is far better than on the first (random tokens cannot be
# predicted), and no better on the corrupted sequences. `loss_per_token=True` gives
# `[batch, pos - 1]`, entry `i` predicting token `i + 1`.


# %%
def halves_loss(tokens: torch.Tensor, fwd_hooks=()) -> tuple[float, float]:
    """Mean loss on the first copy of A and on the second (without its first token)."""
    per_token = model.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=list(fwd_hooks))
    return per_token[:, :SEQ_LEN].mean().item(), per_token[:, SEQ_LEN + 1 :].mean().item()


print("clean      loss on copy 1 / copy 2: {:.3f} / {:.3f}".format(*halves_loss(clean_full)))
print("corrupted  loss on copy 1 / copy 2: {:.3f} / {:.3f}".format(*halves_loss(corrupted_full)))

# %% [markdown]
# Which components write the answer directly? `plots.dla_bar` shows each head's and
# each MLP's direct contribution to the logit difference at the last position
# (`batch=None`: averaged over the prompts); the bars add up to the logit difference.
# What to look at (tiny-gpt2): three bars carry almost all of the 13.5, the two induction
# heads L1H0 and L1H2 (about 3.5 each) and, largest, layer 1's MLP (about 6.5); the
# previous-token head L0H0 writes nothing to the answer directly (its work is to help the
# induction heads find it).

# %%
plots.dla_bar(clean_cache, answers[:, 0], answers[:, 1], batch=None)


# %% [markdown]
# ## 3 · Ablating heads with `run_with_hooks`
#
# A hook has transformer-lens' signature `fn(activation, hook)` and may return a
# replacement. Zeroing one head's `hook_z` (`[batch, pos, head, d_head]`) removes its
# output. First the top induction head (found by score, as in notebook 02), then
# every head in turn.


# %%
def top_head(score: torch.Tensor) -> tuple[int, int]:
    layer, head = divmod(int(score.argmax()), score.shape[1])
    return layer, head


scores = head_scores(model)
ind_layer, ind_head = top_head(scores["induction"])
prev_layer, prev_head = top_head(scores["previous token"])
print(
    f"top induction head L{ind_layer}H{ind_head} ({scores['induction'][ind_layer, ind_head]:.2f}), "
    f"top previous-token head L{prev_layer}H{prev_head} ({scores['previous token'][prev_layer, prev_head]:.2f})"
)


def zero_head(z: torch.Tensor, hook, head: int) -> torch.Tensor:
    z[:, :, head] = 0.0
    return z


ablate_induction = [(get_act_name("z", ind_layer), partial(zero_head, head=ind_head))]
ablated_logits = model.run_with_hooks(clean_tokens, fwd_hooks=ablate_induction)
print(
    f"logit difference: clean {clean_ld:.3f}, "
    f"induction head ablated {logits_to_ave_logit_diff(ablated_logits, answers):.3f}"
)
print(
    "loss on copy 1 / copy 2, induction head ablated: {:.3f} / {:.3f}".format(
        *halves_loss(clean_full, ablate_induction)
    )
)

# %% [markdown]
# A model can have more than one induction head (the shipped tiny-gpt2 has two in
# layer 1, both scoring about 0.86), and then zeroing one leaves the other to do much
# of the copying. Zero every head that scores above 0.5 together:

# %%
induction_heads = [(int(layer), int(head)) for layer, head in (scores["induction"] > 0.5).nonzero()]
ablate_all = [(get_act_name("z", layer), partial(zero_head, head=head)) for layer, head in induction_heads]
print("induction heads:", [f"L{layer}H{head}" for layer, head in induction_heads])
print("loss on copy 1 / copy 2, all of them ablated: {:.3f} / {:.3f}".format(*halves_loss(clean_full, ablate_all)))

# %% [markdown]
# Every head, one at a time: how much the loss on the second copy rises when it is
# zeroed. The induction circuit needs both a previous-token head (to write "the
# token before me" into each position) and an induction head (to look it up), so
# both should stand out. What to look at (tiny-gpt2): the previous-token head L0H0 stands
# out far above the rest (about 8: without it neither induction head can work); each
# induction head alone only adds 1.4 to 1.8, as the other one covers for it (zeroing both
# together, above, costs the whole effect).

# %%
base = halves_loss(clean_full)[1]
loss_increase = torch.zeros(n_layers, n_heads)
for layer in range(n_layers):
    for head in range(n_heads):
        hooks = [(get_act_name("z", layer), partial(zero_head, head=head))]
        loss_increase[layer, head] = halves_loss(clean_full, hooks)[1] - base
plots.head_patching_heatmap(
    loss_increase, title="Zero-ablating one head: loss increase on the second copy", value_label="loss increase"
)

# %% [markdown]
# ## 4 · Activation patching
#
# Run the *corrupted* prompt, put back one activation from the *clean* run, and see
# how much of the clean behaviour returns (metric 0 = corrupted, 1 = clean). The
# functions have `transformer_lens.patching`'s names, arguments and result shapes,
# and the metric is called on each patched run's logits exactly as there; they run
# many patched copies in one batched forward.
#
# `get_act_patch_resid_pre`: the residual stream entering each layer, one position
# at a time, `[n_layers, pos]`. At layer 0 a patch restores one token only. In an
# induction circuit the decisive place is the first copy of `A[STOP]` (the token to
# copy): by the last layer's input its residual also holds, from the previous-token
# head, the token before it, so patching it there restores most of the answer. At
# layer 0, restoring `A[STOP-1]` alone makes the head look at the right place but
# copy the corrupted token there (our "wrong" answer): a negative value. What to look at
# (tiny-gpt2): those two cells, layer 1 at the first copy of `A10` (`A[STOP]`, 0.24) and
# layer 0 at the first copy of `A9` (`A[STOP-1]`, -0.19); every other cell is near 0.

# %%
resid_results = patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric, progress=False)
print(resid_results.shape)
plots.patching_heatmap(
    resid_results, position_labels, title="Patching resid_pre (layer x position)", value_label="normalised logit diff"
)

# %% [markdown]
# `get_act_patch_block_every`: `resid_pre`, `attn_out` and `mlp_out` side by side,
# `[3, n_layers, pos]`. What to look at (tiny-gpt2): one cell dominates, layer 1's
# `attn_out` at the last position (1.0: the induction heads' output there restores the
# whole answer); layer 1's `mlp_out` at the same place restores 0.39, and layer 0's
# `attn_out` at the first copy of `A[STOP]` is negative (-0.23), for the reason given
# for `resid_pre` above.

# %%
block_results = patching.get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric, progress=False)
plots.patching_heatmap(
    block_results,
    position_labels,
    titles=["resid_pre", "attn_out", "mlp_out"],
    title="Patching each block's pieces",
    value_label="normalised logit diff",
)

# %% [markdown]
# Per head: `get_act_patch_attn_head_out_all_pos` patches one head's output (`hook_z`)
# at every position, `[n_layers, n_heads]`; `get_act_patch_attn_head_all_pos_every`
# does that for the output, queries, keys, values and pattern, `[5, n_layers, n_heads]`.
# For an induction head the queries (the current token, the same in both runs) should
# matter little. The keys decide *where* it looks and the values *what* it copies, so
# each alone restores only part of the circuit; clean keys with corrupted values
# even copy `A'[STOP]`, the wrong answer (a negative value). Only the output carries both.
#
# What to look at (tiny-gpt2): no single head restores much (the largest, L1H2, 0.09).
# The two induction heads share the work, so a clean output of one still sits beside the
# other's corrupted one. The previous-token head L0H0 is negative (-0.15): its clean
# output tells the induction heads where `A[STOP-1]` was in the first copy, and in the
# corrupted run the token after that place is `A'[STOP]`, the wrong answer.

# %%
head_out = patching.get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, metric, progress=False)
plots.head_patching_heatmap(
    head_out, title="Patching each head's output (all positions)", value_label="normalised logit diff"
)

# %% [markdown]
# The same per head, for each of the head's pieces (output, queries, keys, values,
# pattern), five panels on one colour scale. What to look at: the queries panel is blank
# (both runs end with the same tokens); the keys and patterns of L1H2 and L0H2 are
# negative (about -0.09 and -0.07: clean attention over corrupted tokens points the
# circuit at `A'[STOP]`); L0H0's values carry its whole (negative) effect.

# %%
every = patching.get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, metric, progress=False)
plots.head_patching_heatmap(
    every,
    titles=["output", "query", "key", "value", "pattern"],
    title="Patching each head's pieces (all positions)",
    value_label="normalised logit diff",
)

# %% [markdown]
# ## 5 · Attribution patching
#
# Attribution patching estimates *every* patch at once from two forwards and one
# backward: `(clean_act - corrupted_act) * d metric / d act`, summed over the patched
# slice, the gradient taken on the corrupted run. `patching.attribution_patch`
# returns the estimates laid out like the sweeps (`result["resid_pre"]` is
# `[n_layers, pos]`, `result["attn_head_out_all_pos"]` `[n_layers, n_heads]`). Each
# estimates `metric(patched) - metric(corrupted)`; with the normalised metric the
# corrupted run scores 0, so it is directly comparable with the sweeps above. The
# metric must stay differentiable (no `.item()`): `normalized_logit_diff`'s is.
#
# What to look at in the two panels: the colour scale. Real patching reaches 0.24 and
# -0.19; the estimates stay under 0.05 and their largest cell is elsewhere (layer 0,
# position 1). Here the linear estimate is a poor guide; the scatter below shows why.

# %%
attribution = patching.attribution_patch(model, clean_tokens, corrupted_tokens, metric)
print(f"clean metric {attribution.clean_metric:.3f}, corrupted metric {attribution.corrupted_metric:.3f}")
print(attribution.keys())
plots.patching_heatmap(
    torch.stack([resid_results - attribution.corrupted_metric, attribution["resid_pre"]]),
    position_labels,
    titles=["activation patching", "attribution patching"],
    title="resid_pre: real patching vs its linear estimate",
    value_label="change in metric",
)

# %% [markdown]
# And per head (`attn_head_out_all_pos`), next to the real patching of head outputs.
# What to look at: the estimate puts the induction heads L1H0 and L1H2 first (about
# 0.04 each), while real patching finds L0H0 largest, and negative (-0.15): neither the
# sizes nor the signs of this estimate can be read as effects.

# %%
plots.head_patching_heatmap(
    torch.stack([head_out - attribution.corrupted_metric, attribution["attn_head_out_all_pos"]]),
    titles=["activation patching", "attribution patching"],
    title="Head outputs: real patching vs its linear estimate",
    value_label="change in metric",
)

# %% [markdown]
# How good is the linear estimate? `patching.attribution_vs_activation_patching` runs
# the real sweep (reusing the attribution result) and reports the Pearson correlation
# over all patches and the largest error. We also print the slope of the estimate
# against the real effect (least squares through 0): a correlation near 1 says the
# estimate ranks the patches right, and only a slope near 1 says it also gets their
# size right. The estimate is exact where the metric is linear in the activation; here
# nothing is, not even the last layer's `mlp_out`, because of the final LayerNorm (next).

# %%
sweeps = ["resid_pre", "attn_out", "mlp_out", "attn_head_out_all_pos"]
comparisons = {
    sweep: patching.attribution_vs_activation_patching(
        model, clean_tokens, corrupted_tokens, metric, sweep, attribution=attribution
    )
    for sweep in sweeps
}


def slope(c) -> float:
    """Least-squares slope of the estimate against the real effect, through 0."""
    real, estimate = c.patching.flatten(), c.attribution.flatten()
    return float((real * estimate).sum() / (real * real).sum())


for sweep, c in comparisons.items():
    print(f"{sweep:<24} correlation {c.correlation:+.3f}   slope {slope(c):.3f}   max |error| {c.max_abs_error:.3f}")

# %% [markdown]
# On tiny-gpt2, `attn_out` and `mlp_out` correlate well (one patch dominates each: layer 1 at the last
# position) but their slopes are far below 1: patching layer 1's attention output at the
# last position restores the whole answer (1.0), and the estimate says 0.07. The metric is
# not the cause (it is a logit difference; normalising it is linear). The final LayerNorm
# is: the logits are the final residual divided by its scale (`ln_final.hook_scale`). On
# the corrupted run, where the induction head finds nothing to copy, layer 1's MLP writes
# a vector about ten times the norm of the rest of the stream at the last position, so the
# scale is large and every logit is shrunk (a flat, unsure prediction); on the clean run it
# does not. A clean patch of layer 1's attention or MLP output removes that vector, the
# scale drops about tenfold, and the logit difference is multiplied by as much. The
# gradient is taken on the corrupted run, at the corrupted scale: it sees the answer's
# direction but not the division by a scale ten times smaller.

# %%
last = [get_act_name("mlp_out", n_layers - 1), "ln_final.hook_scale"]
_, corrupted_cache = model.run_with_cache(corrupted_tokens, names_filter=last)
for run, run_cache in (("clean", clean_cache), ("corrupted", corrupted_cache)):
    mlp_norm = run_cache[get_act_name("mlp_out", n_layers - 1)][:, -1].norm(dim=-1).mean()
    scale = run_cache["ln_final.hook_scale"][:, -1, 0].mean()
    print(
        f"{run:<9} last position: |mlp_out of layer {n_layers - 1}| {mlp_norm:6.2f}   final LayerNorm scale {scale:.2f}"
    )

# %% [markdown]
# One point per patch: the real effect across, the estimate up; on the dashed line the
# estimate is exact. What to look at (tiny-gpt2): the two points at the right (layer 1's `attn_out`
# at 1.0 and `mlp_out` at 0.39, both estimated below 0.08) lie far under the line, for
# the LayerNorm reason above; `resid_pre`'s largest real effects (0.24 and -0.19) are
# estimated near 0 (patching a whole residual stream moves the run far from where the
# gradient was taken); most patches sit near (0, 0). Attribution patching is a cheap
# first pass that finds where to look; the real patching of the few places it points
# at gives the sizes.

# %%
fig = go.Figure()
for sweep, c in comparisons.items():
    fig.add_trace(
        go.Scatter(
            x=c.patching.flatten().cpu(),
            y=c.attribution.flatten().cpu(),
            mode="markers",
            name=f"{sweep} (r = {c.correlation:.2f}, slope {slope(c):.2f})",
            opacity=0.7,
        )
    )
lo = min(float(min(c.patching.min(), c.attribution.min())) for c in comparisons.values())
hi = max(float(max(c.patching.max(), c.attribution.max())) for c in comparisons.values())
fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(dash="dash", color="gray")))
fig.update_layout(
    title="Attribution patching vs activation patching, one point per patch",
    xaxis_title="activation patching: change in metric",
    yaxis_title="attribution patching: estimate",
    width=800,
    height=600,
)
fig
