# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Load a model and check it against transformer-lens and Hugging Face
#
# `interp_gpt` is a from-scratch GPT-2 with transformer-lens' parameter names, hook
# names and API (`run_with_cache`, `run_with_hooks`, `cache["pattern", 0]`,
# `from_pretrained` with the same weight processing). This notebook
#
# 1. loads a model twice: processed (as `HookedTransformer.from_pretrained` does by
#    default) and unprocessed (`from_pretrained_no_processing`);
# 2. runs it on a prompt;
# 3. runs transformer-lens and Hugging Face `transformers` on the same tokens and
#    compares the logits and **every activation both sides expose**, hook by hook;
# 4. plots the largest difference of each hook.

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

import plotly.graph_objects as go
import torch

from interp_gpt import GPT, compare, to_transformer_lens, to_transformers
from interp_gpt.loading import shipped_models

# %% [markdown]
# ## Load the model, processed and unprocessed
#
# `GPT.from_pretrained` applies transformer-lens' default processing: `fold_ln`
# (LayerNorm weights folded into the next matrices, leaving `LNPre`),
# `center_writing_weights`, `center_unembed` and `fold_value_biases`; each is a
# keyword flag. `GPT.from_pretrained_no_processing` keeps the weights as stored,
# which is what Hugging Face computes with.

# %%
torch.set_grad_enabled(False)  # inference only in this notebook
model = GPT.from_pretrained(MODEL_NAME)
raw = GPT.from_pretrained_no_processing(MODEL_NAME)
print(model.cfg)
print(model.tokenizer)

# %% [markdown]
# ## Run it on a prompt
#
# Strings go through the model's own tokenizer; `to_tokens` prepends BOS as
# transformer-lens does for GPT-2. The model returns logits `[batch, pos, d_vocab]`,
# or the next-token loss with `return_type="loss"`.

# %%
PROMPT = "To be, or not to be, that is the question:"
tokens = model.to_tokens(PROMPT)
print(tokens.shape, model.to_str_tokens(PROMPT))

logits, loss = model(tokens, return_type="both")
print(f"loss {loss.item():.3f}")
top = logits[0, -1].softmax(-1).topk(5)
for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
    print(f"  {p:.3f}  {model.to_string([i])!r}")

# %% [markdown]
# Greedy continuation with `generate` (`do_sample=False`; it uses a key/value cache,
# and hooks fire at every step).

# %%
model.generate(PROMPT, max_new_tokens=20, do_sample=False)

# %% [markdown]
# Processing changes the weights but not what the model computes, with one
# caveat: `center_unembed` subtracts each row's mean from the logits, so processed
# and unprocessed logits differ by a constant per position while the **log-probs**
# agree. That is why processed models are compared by log-probs below.

# %%
raw_logits = raw(tokens)
print(f"max |logits(processed) - logits(raw)|       {(logits - raw_logits).abs().max():.2e}")
print(
    f"max |log-probs(processed) - log-probs(raw)| "
    f"{(logits.log_softmax(-1) - raw_logits.log_softmax(-1)).abs().max():.2e}"
)


# %% [markdown]
# ## Build the references from the same checkpoint
#
# `to_transformer_lens(source)` builds a transformer-lens model offline with the
# checkpoint's weights (a `TransformerBridge` in compatibility mode on
# transformer-lens 4, a `HookedTransformer` on 3.x); `processed=False` skips the
# weight processing. `to_transformers(source)` builds a Hugging Face
# `GPT2LMHeadModel`.
#
# Both also accept a model name (`to_transformer_lens("tiny-gpt2")` works), but then
# the reference is built from *interp_gpt's* reading of the checkpoint. Given a local
# folder, `transformers.GPT2LMHeadModel.from_pretrained` reads the files itself, so
# the references are independent of our loader. `checkpoint_folder` finds that
# folder: inside the package for a shipped model, in the hub cache otherwise.


# %%
def checkpoint_folder(name: str) -> Path:
    """The local folder holding `name`'s config.json and weights."""
    if name in shipped_models():
        return shipped_models()[name]
    if Path(name).expanduser().is_dir():  # already a local checkpoint folder
        return Path(name).expanduser()
    from huggingface_hub import snapshot_download

    files = ["config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json"]
    return Path(snapshot_download(name, allow_patterns=files))


folder = checkpoint_folder(MODEL_NAME)
print(sorted(p.name for p in folder.iterdir()))  # its files (its path depends on the machine)
tl_model = to_transformer_lens(folder)  # processed, like `model`
tl_raw = to_transformer_lens(folder, processed=False)  # unprocessed, like `raw`
hf_model = to_transformers(folder)  # always the stored weights
print(type(tl_model).__name__, type(hf_model).__name__)

# %% [markdown]
# ## Compare, hook by hook
#
# `compare(ours, reference, input)` runs both models on the same tokens, caches every
# activation, and for each hook name both expose reports the largest absolute and
# relative difference. A hook passes when every element is within
# `atol 1e-5 + rtol 1e-4 * |reference|`; the logits (log-probs for processed
# weights) within `1e-4`. `report.table()` prints it; `report.passed` is the verdict.
#
# First our processed model against transformer-lens' processed one: every hook,
# including `hook_attn_scores`, `hook_pattern`, `ln*.hook_scale` and the MLP
# activations.

# %%
report_tl = compare(model, tl_model, tokens)
print(report_tl.table())
report_tl.passed

# %% [markdown]
# The unprocessed model against transformer-lens without processing (here the raw
# logits must match too, not just the log-probs), and against Hugging Face. From
# `transformers` we can read the embeddings, the residual stream, the attention and
# MLP outputs and the MLP's pre/post activations; `table(per_layer=False)` gives the
# largest difference per hook family.

# %%
report_tl_raw = compare(raw, tl_raw, tokens)
print(report_tl_raw.table(per_layer=False))
report_hf = compare(raw, hf_model, tokens)
print()
print(report_hf.table(per_layer=False))
report_tl_raw.passed, report_hf.passed

# %% [markdown]
# Hugging Face only has the stored weights, so against the *processed* model only the
# log-probs can be compared (the residual stream itself differs by design:
# `center_writing_weights` removes its mean).

# %%
report_hf_processed = compare(model, hf_model, tokens)
print(report_hf_processed.table())

# %% [markdown]
# With no `input`, `compare` uses a fixed batch of random tokens (2 x 24), which
# exercises the batch axis and tokens the prompt does not contain.

# %%
report_random = compare(model, tl_model)
print(report_random.table(per_layer=False))
report_random.passed

# %% [markdown]
# ## Plot the differences
#
# One point per hook (and one for the logits or log-probs), per comparison, on a log
# axis. A log axis has no zero: a hook that agrees exactly (e.g. the embeddings,
# read from the same matrix) is drawn at `1e-10`. The dashed line is the absolute
# tolerance; a point above it can still pass through the relative term
# (`rtol * |reference|`), which `report.passed` accounts for.
#
# What to look at (tiny-gpt2): every point lies below the dashed line (atol `1e-5`). The
# largest in each comparison is at the output: the log-probs, 5.0e-6 (processed vs
# transformer-lens) and 8.8e-6 (processed vs Hugging Face), `unembed.hook_out` 5.7e-6
# (unprocessed vs transformer-lens) and the logits 8.1e-6 (unprocessed vs Hugging Face);
# the embeddings agree exactly and sit on the `1e-10` floor. "processed vs Hugging Face"
# has a single point: processing changes every activation (centred, LayerNorm folded),
# so it shares no hook with Hugging Face, and its logits are shifted by a constant per
# position (up to 2.8), which the log-probs cancel.

# %%
FLOOR = 1e-10
reports = {
    "processed vs transformer-lens": report_tl,
    "unprocessed vs transformer-lens": report_tl_raw,
    "unprocessed vs Hugging Face": report_hf,
    "processed vs Hugging Face": report_hf_processed,
}
fig = go.Figure()
for label, report in reports.items():
    names = [row.name for row in report.rows] + ["log-probs" if report.logprobs else "logits"]
    values = [row.max_abs for row in report.rows]
    values.append(report.logprobs_max_abs if report.logprobs else report.logits_max_abs)
    fig.add_trace(
        go.Scatter(
            x=names,
            y=[max(v, FLOOR) for v in values],
            customdata=values,
            mode="markers",
            name=label,
            hovertemplate="%{x}<br>max |diff| %{customdata:.3e}<extra></extra>",
        )
    )
fig.add_hline(y=report_tl.atol, line_dash="dash", annotation_text=f"atol {report_tl.atol:g}")
fig.update_layout(
    title=f"{MODEL_NAME}: largest |interp_gpt - reference| per hook",
    xaxis=dict(title="hook", type="category", tickangle=-60),
    yaxis=dict(title="max |difference|", type="log", exponentformat="power"),
    width=1100,
    height=650,
    legend=dict(orientation="h", y=1.02, yanchor="bottom"),
)
fig

# %% [markdown]
# The one-liners do the loading too: `compare_with_transformer_lens(source, input)`
# and `compare_with_huggingface(source, input)`; from a shell,
# `interp-gpt compare <source>` prints the same table.

# %%
from interp_gpt import compare_with_huggingface, compare_with_transformer_lens

print(compare_with_transformer_lens(folder, PROMPT).passed, compare_with_huggingface(folder, PROMPT).passed)
