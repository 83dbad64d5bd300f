# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Reading the residual stream with a sparse autoencoder
#
# A sparse autoencoder (SAE) rewrites an activation as a sparse sum of learned directions,
# its *features*. The package ships one, trained here for `tiny-gpt2`'s
# `blocks.1.hook_resid_pre` (a TopK SAE: 1024 features, 32 active per token):
#
# 1. load it and splice it into the model, with and without the error term;
# 2. find the features most active on a prompt;
# 3. one feature's dashboard: top contexts, activation histogram, the tokens it promotes;
# 4. ablate a feature and measure what it does to the loss;
# 5. attribution patching over features, checked against real patching.

# %%
MODEL_NAME = "tiny-gpt2"  # the SAE below was trained on this model; other models need their own SAE

# %% [markdown]
# The SAE is stored in SAELens' format (`cfg.json` + `sae_weights.safetensors`), so
# `SAE.from_pretrained(folder)` here and sae-lens' `SAE.load_from_disk(folder)` both load it.
# `metrics.json` beside it holds its metrics on the held-out validation text (the last 10% of
# each corpus file) and the command that trained it.

# %%
import json
from pathlib import Path

import plotly.graph_objects as go
import torch

import interp_gpt
from interp_gpt import GPT
from interp_gpt.sae import SAE
from interp_gpt.sae.features import feature_figures, feature_page, feature_report, format_feature
from interp_gpt.sae.training import SHIPPED_SAE_DIR, split_corpus, token_windows

torch.set_grad_enabled(False)
model = GPT.from_pretrained(MODEL_NAME)
sae = SAE.from_pretrained(SHIPPED_SAE_DIR)
print(sae)
metrics = json.loads((SHIPPED_SAE_DIR / "metrics.json").read_text())["validation"]
for key in ("l0", "explained_variance", "ce_loss_recovered", "ce_clean", "ce_spliced", "ce_zero_ablation"):
    print(f"{key:20s} {metrics[key]:.3f}")

# %% [markdown]
# ## 1 · Splicing
#
# `with model.saes([sae]):` replaces the activation at the SAE's hook by its reconstruction
# for the duration of the block (and always takes it out again). With `use_error_term=True`
# the SAE's error is added back, so the model computes exactly what it computes without the
# SAE, while the features are still there to read, ablate and differentiate.

# %%
PROMPT = "Then the king said to the queen: my lord, the prince is come, and the king is dead."
tokens = model.to_tokens(PROMPT)
clean_loss = model(tokens, return_type="loss")
with model.saes([sae]):
    spliced_loss = model(tokens, return_type="loss")
with model.saes([sae], use_error_term=True):
    error_term_loss = model(tokens, return_type="loss")
print(f"loss without the SAE   {clean_loss:.4f}")
print(f"with the SAE spliced   {spliced_loss:.4f}")
print(f"with the error term    {error_term_loss:.4f}  (equal: {bool(error_term_loss == clean_loss)})")
print("spliced now:", model.acts_to_saes)

# %% [markdown]
# ## 2 · The features most active on a prompt
#
# The SAE's hook points carry SAELens' names under the model's hook:
# `blocks.1.hook_resid_pre.hook_sae_acts_post` holds the feature activations `[batch, pos, d_sae]`.
# Some features fire on a large share of all tokens (position- or context-like directions); to find
# the specific ones, we first measure how often each feature fires on 96 windows of the validation
# text (the last 10% of each corpus file, which the SAE never trained on).
#
# What to look at in the heatmap below (tiny-gpt2): the top four features, f282, f253, f342 and
# f225, light up on the four ` the` (positions 2, 6, 12, 18; f282 up to 1.0); f443 on ` said` and
# ` is` (positions 4, 14, 20; 0.4 to 0.5); f490 on ` king`, ` queen`, ` king` (0.3 to 0.4); f730
# (1.0) and f973 (0.7) on ` and` (position 17). On this prompt the specific features are mostly
# about the token itself.

# %%
FEATS = "blocks.1.hook_resid_pre.hook_sae_acts_post"
CORPUS = Path(interp_gpt.__file__).resolve().parents[1] / "data" / "corpus"  # in a source checkout
_, val_texts = split_corpus(CORPUS)
val_tokens = token_windows(model, val_texts, 128, max_windows=96)
with model.saes([sae], use_error_term=True):
    _, val_cache = model.run_with_cache(val_tokens, names_filter=[FEATS])
    _, cache = model.run_with_cache(tokens, names_filter=[FEATS])
density = (val_cache[FEATS] > 0).float().mean((0, 1))  # [d_sae]: share of tokens each feature fires on
print(f"features firing on > 5% of tokens: {int((density > 0.05).sum())}, never firing: {int((density == 0).sum())}")

acts = cache[FEATS][0]  # [pos, d_sae]
str_tokens = model.to_str_tokens(tokens[0], prepend_bos=False)
print(f"active features per token: {(acts > 0).sum(-1).float().mean():.1f} (k = {sae.cfg.k})")
total = acts[1:].sum(0) * (density < 0.05)  # leave out BOS (the same vector everywhere) and dense features
top = total.topk(8)
for f, value in zip(top.indices.tolist(), top.values.tolist(), strict=True):
    where = [repr(str_tokens[p]) for p in acts[:, f].topk(3).indices.tolist() if acts[p, f] > 0]
    print(f"feature {f:4d}  total {value:5.2f}  fires on {density[f]:6.2%} of tokens; strongest on {', '.join(where)}")
go.Figure(
    go.Heatmap(
        z=acts[:, top.indices].T.tolist(),
        x=[f"{i}: {t!r}" for i, t in enumerate(str_tokens)],
        y=[f"f{f}" for f in top.indices.tolist()],
        colorscale="Oranges",
    ),
    layout={"title": "the top (non-dense) features on each token of the prompt", "height": 380},
).show()

# %% [markdown]
# ## 3 · One feature's dashboard
#
# `feature_report` runs the model over text (here the 96 validation windows) and, for one feature,
# collects its top-activating contexts, all its activations, and the tokens its decoder direction
# promotes and suppresses through the unembedding (`W_dec[f] @ W_U`, as SAELens' dashboards show it).
# `format_feature` is the terminal view (`interp-gpt features tiny-gpt2 tiny-gpt2-sae --feature N`
# prints the same); `feature_page` writes one offline page. The feature: the non-dense one that
# fires most on both " king" and " queen" in the prompt.

# %%
both = torch.minimum(acts[str_tokens.index(" king")], acts[str_tokens.index(" queen")])
FEATURE = int((both * (density < 0.05)).argmax())
report = feature_report(model, sae, val_tokens, FEATURE, n_contexts=6)
print(format_feature(report))

# %% [markdown]
# The same report as plotly figures, and as one offline page (plotly.js inlined, token text escaped,
# no request to any server) that opens in a browser.
#
# What to look at (tiny-gpt2): in the histogram, feature 185 fires on 444 tokens (3.61% of
# 12288), mostly weakly (the tallest bar, 90 tokens, is at 0.18 to 0.25); the tail up to 0.74
# is the contexts above, ` daughter` most of all. In the bars, what its decoder direction does
# to the logits directly: it promotes word pieces (`a` +0.66, `au` +0.65, `aw` +0.64) and
# suppresses `out` (-0.54), ` him` (-0.50), ` them` (-0.49). Neither list has anything to do with
# ` daughter`: what a feature fires on and what it writes are two questions, and the next cell
# shows that zeroing it hardly moves the loss (+0.00013).

# %%
figs = feature_figures(report)
figs["histogram"].show()
figs["logits"].show()
print("wrote", feature_page(report, f"feature_{FEATURE}.html").name)

# %% [markdown]
# ## 4 · Ablating a feature
#
# With the error term spliced in, zeroing one feature at `hook_sae_acts_post` changes the
# model's input to layer 1 by exactly that feature's contribution (its activation times its
# decoder row): the change in the loss is that feature's effect. Here on the validation windows,
# for the feature above and for the SAE as a whole.


# %%
def zero_feature(f: int):
    def hook(acts: torch.Tensor, hook) -> torch.Tensor:
        acts[..., f] = 0.0
        return acts

    return hook


batch = val_tokens[:32]
with model.saes([sae], use_error_term=True):
    base = model(batch, return_type="loss")
    ablated = model.run_with_hooks(batch, return_type="loss", fwd_hooks=[(FEATS, zero_feature(FEATURE))])
    per_token = model.run_with_hooks(
        batch, return_type="loss", loss_per_token=True, fwd_hooks=[(FEATS, zero_feature(FEATURE))]
    ) - model(batch, return_type="loss", loss_per_token=True)
    _, c = model.run_with_cache(batch, names_filter=[FEATS])
fires = c[FEATS][:, :-1, FEATURE] > 0  # the loss at position p predicts token p + 1
print(f"loss {base:.4f} -> {ablated:.4f} with feature {FEATURE} zeroed (change {ablated - base:+.5f})")
print(
    f"mean change at the {int(fires.sum())} positions where it fires: {per_token[fires].mean():+.4f}; "
    f"at the others (only through attention from earlier positions): {per_token[~fires].mean():+.5f}"
)

# %% [markdown]
# ## 5 · Attribution patching over features
#
# Two prompts that differ in one name; the metric is the logit difference between the two
# names as the next token. The name sits early in the prompt, so what the model knows about it at
# the last position was moved there by attention: which features of which positions carry it? Attribution patching estimates, for every (position, feature),
# what patching that feature's clean activation into the corrupted run would do:
# `(clean - corrupted) * d metric / d feature`, from one clean forward, one corrupted forward and
# one backward (the feature activations are ordinary hook points, so `run_with_cache(...,
# incl_bwd=True)` gives their gradients). Then real patching checks the top estimates.

# %%
clean = model.to_tokens("Then the king came in, and the")
corrupted = model.to_tokens("Then the queen came in, and the")
assert clean.shape == corrupted.shape
king, queen = model.to_single_token(" king"), model.to_single_token(" queen")


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[0, -1, king] - logits[0, -1, queen]


saved: dict[str, torch.Tensor] = {}


def save(name: str):
    def hook(t: torch.Tensor, hook) -> None:
        saved[name] = t.detach().clone()

    return hook


with model.saes([sae], use_error_term=True):
    print(f"metric: clean {metric(model(clean)):.3f}, corrupted {metric(model(corrupted)):.3f}")
    _, clean_cache = model.run_with_cache(clean, names_filter=[FEATS])
    with torch.enable_grad(), model.hooks(fwd_hooks=[(FEATS, save("acts"))], bwd_hooks=[(FEATS, save("grad"))]):
        metric(model(corrupted)).backward()
    attribution = ((clean_cache[FEATS] - saved["acts"]) * saved["grad"])[0]  # [pos, d_sae]
    base = metric(model(corrupted))
    print("estimate   actual   (position, token, feature)")
    for idx in attribution.abs().flatten().topk(6).indices.tolist():
        pos, f = divmod(idx, sae.cfg.d_sae)

        def patch(acts: torch.Tensor, hook, pos=pos, f=f) -> torch.Tensor:
            acts[0, pos, f] = clean_cache[FEATS][0, pos, f]
            return acts

        actual = metric(model.run_with_hooks(corrupted, fwd_hooks=[(FEATS, patch)])) - base
        print(f"{attribution[pos, f]:+8.3f} {actual:+8.3f}   ({pos}, {model.to_str_tokens(corrupted[0])[pos]!r}, {f})")

# %% [markdown]
# The estimates are first-order (a linear approximation around the corrupted run), so they are
# close where the model is near-linear in a feature and differ most for the largest patches. Every
# `with model.saes(...)` block took the SAE out again:

# %%
print("SAEs still spliced in:", model.acts_to_saes)
