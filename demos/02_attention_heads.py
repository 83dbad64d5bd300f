# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Find attention heads by what they do
#
# Three standard head scores, each one number per (layer, head) in [0, 1]:
#
# - **previous-token**: mean attention from each position to the one just before it;
# - **duplicate-token**: mean attention to earlier copies of the current token;
# - **induction**: mean attention to the token *after* an earlier copy of the current
#   token (at `... A B ... A` it attends to `B`).
#
# As in transformer-lens' induction evals, they are measured on repeated random tokens
# (`BOS A A`), where the only way to predict the second `A` is to copy from the first.
# We then pick the top previous-token head and the top induction head by score, look
# at their patterns on a repeated sequence and on real text, and save an interactive
# viewer of every head as one offline HTML file.

# %%
MODEL_NAME = "tiny-gpt2"  # or "gpt2" (needs the Hugging Face hub)

# %% [markdown]
# The model: `"tiny-gpt2"` ships inside the package (2 layers, 4 heads, d_model 128,
# a 2048-token byte-level BPE, trained on Shakespeare and War and Peace) and loads with
# no network. Set `MODEL_NAME = "gpt2"` to run everything on GPT-2 small instead (it is
# downloaded through the Hugging Face hub and its cache). Nothing below depends on
# which model it is: layers and heads are found from the model's own numbers.

# %%
from pathlib import Path

import torch

from interp_gpt import GPT, plots
from interp_gpt.inspect import head_scores, induction_scores, previous_token_scores, repeated_tokens

torch.set_grad_enabled(False)
model = GPT.from_pretrained(MODEL_NAME)
print(model.cfg.model_name, f"{model.cfg.n_layers} layers x {model.cfg.n_heads} heads")

# %% [markdown]
# ## Head scores
#
# `head_scores(model)` draws 8 random sequences, repeats each (`repeated_tokens`),
# caches only the attention patterns, and returns a dict of `[n_layers, n_heads]`
# tensors. `plots.head_scores_heatmap` draws the dict, one panel per score.

# %%
scores = head_scores(model, batch_size=8, seed=0)
{name: s.shape for name, s in scores.items()}

# %% [markdown]
# Drawn as heatmaps, one panel per score (hover for the exact value). What to look at
# (tiny-gpt2): in "previous token", L0H0 (0.63) stands out, the next is L0H3 (0.24); in
# "induction", two heads of layer 1, L1H0 (0.86) and L1H2 (0.86), every other head under
# 0.02; "duplicate token" is blank (no head above 0.005): tiny-gpt2 has no such head.

# %%
plots.head_scores_heatmap(scores)


# %% [markdown]
# ## Pick the heads by score
#
# `argmax` over the flattened `[n_layers, n_heads]` tensor, turned back into
# (layer, head). `argmax` always returns *some* head: read the score too. A head
# that does the job scores well above the others (an induction head on repeated
# random tokens typically > 0.3); if the top score is close to the rest, the model
# has no such head.


# %%
def top_head(score: torch.Tensor) -> tuple[int, int]:
    """(layer, head) of the largest entry of a [n_layers, n_heads] score tensor."""
    layer, head = divmod(int(score.argmax()), score.shape[1])
    return layer, head


prev_layer, prev_head = top_head(scores["previous token"])
ind_layer, ind_head = top_head(scores["induction"])
print(
    f"top previous-token head: L{prev_layer}H{prev_head}, "
    f"score {scores['previous token'][prev_layer, prev_head]:.3f} "
    f"(mean over all heads {scores['previous token'].mean():.3f})"
)
print(
    f"top induction head:      L{ind_layer}H{ind_head}, "
    f"score {scores['induction'][ind_layer, ind_head]:.3f} "
    f"(mean over all heads {scores['induction'].mean():.3f})"
)

# %% [markdown]
# ## Their patterns on a repeated random sequence
#
# One sequence of 15 random tokens, repeated. `run_with_cache` returns logits and an
# `ActivationCache`; `plots.attention_heatmap(cache, str_tokens, layer, head)` draws
# one head (queries down, keys across, the tokens on both axes; spaces show as `␣`).
#
# A previous-token head is a bright line just below the diagonal. An induction
# head, in the second half, attends one position *after* the earlier copy: a line
# parallel to the diagonal, `seq_len - 1` positions to its left.
#
# What to look at (tiny-gpt2): L0H0's line just below the diagonal, 0.98 on average, on
# every row, in both copies: it does not care whether a token was seen before.

# %%
rep_tokens = repeated_tokens(model, seq_len=15, batch_size=1, seed=1)  # [1, 1 + 2 * 15]
rep_str = model.to_str_tokens(rep_tokens[0])
_, rep_cache = model.run_with_cache(rep_tokens)
plots.attention_heatmap(
    rep_cache,
    rep_str,
    layer=prev_layer,
    head=prev_head,
    title=f"Top previous-token head L{prev_layer}H{prev_head}, repeated random tokens",
)

# %% [markdown]
# And the top induction head on the same tokens: in the second copy, each query
# should attend to the token just after its earlier copy. What to look at (tiny-gpt2):
# in the second copy (rows 16 to 30), L1H0's line 14 positions left of the diagonal,
# 0.87 on average; in the first copy there is nothing to find, and the rows put about
# half their attention (0.49 on average) on the first token, `<|endoftext|>`.

# %%
plots.attention_heatmap(
    rep_cache,
    rep_str,
    layer=ind_layer,
    head=ind_head,
    title=f"Top induction head L{ind_layer}H{ind_head}, repeated random tokens",
)

# %% [markdown]
# ## On real text
#
# The same heads on text with natural repeats ("and tomorrow", "Tomorrow"). The
# scores can be computed on any cache: `previous_token_scores(cache)` and
# `induction_scores(cache, tokens)` (the latter needs at least one repeated token).

# %%
TEXT = (
    "Tomorrow, and tomorrow, and tomorrow,\n"
    "Creeps in this petty pace from day to day,\n"
    "To the last syllable of recorded time;\n"
    "Tomorrow, and tomorrow, and tomorrow."
)
text_tokens = model.to_tokens(TEXT)
text_str = model.to_str_tokens(TEXT)
_, text_cache = model.run_with_cache(text_tokens)
print(len(text_str), "tokens")
print("previous-token scores on the text:\n", previous_token_scores(text_cache))
print("induction scores on the text:\n", induction_scores(text_cache, text_tokens))

# %% [markdown]
# The previous-token head on the text: attention one step back, whatever the tokens.
# What to look at (tiny-gpt2): the same line below the diagonal as on random tokens, 0.96
# on average over the 56 rows (its previous-token score on the text, printed above).

# %%
plots.attention_heatmap(
    text_cache,
    text_str,
    layer=prev_layer,
    head=prev_head,
    title=f"Previous-token head L{prev_layer}H{prev_head} on text",
)

# %% [markdown]
# The induction head on the text: from the second "Tomorrow, and tomorrow" on, a query
# can attend to what followed its previous occurrence. What to look at (tiny-gpt2): the
# bright cells off the diagonal in the rows of repeated words (its induction score on the
# text is 0.47, printed above); most other rows rest on the first column,
# `<|endoftext|>` (0.58 of the attention on average): with nothing to copy, the head
# looks at a token that writes little.

# %%
plots.attention_heatmap(
    text_cache, text_str, layer=ind_layer, head=ind_head, title=f"Induction head L{ind_layer}H{ind_head} on text"
)

# %% [markdown]
# Every head of the induction head's layer at once, on one colour scale. What to look at
# (tiny-gpt2): heads 0 and 2 look alike (induction scores 0.47 and 0.47 on the text, most
# of the rest on `<|endoftext|>`, 0.58 and 0.71 of the attention on average); heads 1 and
# 3 spread their attention (a row's largest weight is 0.33 and 0.30 on average), with
# no pattern to read.

# %%
plots.attention_grid(text_cache, text_str, layer=ind_layer)

# %% [markdown]
# ## The attention viewer, saved as one offline page
#
# `plots.attention_viewer` puts every head of every layer in one figure with a layer
# menu and a head menu (plotly's own menus, no extra JavaScript); here it opens on
# the induction head. `plots.save_html` writes it as a single self-contained HTML
# file: plotly.js is inside, and a Content-Security-Policy forbids any request, so
# it opens offline and can be mailed around.
#
# The file goes into the **current working directory** (the directory the notebook's
# kernel runs in); `path.resolve()` is its full path.
#
# What to look at: the two menus above the heatmap. Pick L0H0 for the previous-token
# line (0.96 on this text) and L1H2 for the second induction head, which looks like
# L1H0.

# %%
viewer = plots.attention_viewer(text_cache, text_str, layer=ind_layer, head=ind_head)
path = plots.save_html(viewer, Path.cwd() / "attention_viewer.html")
print(f"saved {path.name} in the working directory")
viewer
