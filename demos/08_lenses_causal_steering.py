# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · A direction in the residual stream: find it, probe it, localise it, steer with it, read it
#
# The shipped model was trained on two books: Shakespeare's plays and Tolstoy's *War and Peace*.
# Somewhere in its residual stream it must keep track of which one it is reading, because the two
# predict very different next tokens (` thou` against ` Pierre`). This notebook follows that
# variable with the tools of `interp_gpt.steering`, `interp_gpt.causal` and `interp_gpt.lenses`:
#
# 1. a **contrastive direction**: the mean difference of the residual stream on Shakespeare and on
#    Tolstoy (`contrastive_vector`, as in contrastive activation addition);
# 2. a **sparse probe**: how few residual dimensions already tell the books apart (`sparse_probing`,
#    transformer-lens 4.3's definition);
# 3. **DAS**: the one direction whose *interchange* between a Shakespeare run and a Tolstoy run moves
#    the model's prediction, against a norm-matched placebo (`fit_das`, `interchange`);
# 4. **steering**: adding the direction during generation (`steer`, with the KV cache);
# 5. **lenses**: what each layer already predicts, read with the logit lens and with a tuned lens
#    trained here (`fit_tuned_lens`), measured by the KL divergence from the model's final output.

# %%
MODEL_NAME = "tiny-gpt2"  # or "gpt2": the same cells run; the printed numbers below are tiny-gpt2's

# %% [markdown]
# The text: the last 10% of each book (`split_corpus`, the tail the shipped model never trained
# on), cut into windows of 24 tokens after a BOS. The first 200 windows of each book find the
# direction; the other 200 test it. The hook: the residual stream entering the model's middle
# layer (`blocks.1.hook_resid_pre` on tiny-gpt2, which has 2 layers). Gradients stay off except
# where a fit switches them on itself.

# %%
from pathlib import Path

import plotly.graph_objects as go
import torch

import interp_gpt
from interp_gpt import GPT, plots
from interp_gpt.causal import (
    collect_activations,
    fit_das,
    interchange,
    norm_matched_placebo,
    random_basis,
    sparse_probing,
)
from interp_gpt.lenses import TunedLens, fit_tuned_lens, jacobian_lens, lens_kl, lens_windows
from interp_gpt.sae.training import split_corpus
from interp_gpt.steering import contrastive_vector, steer

torch.set_grad_enabled(False)
model = GPT.from_pretrained(MODEL_NAME)
HOOK = f"blocks.{model.cfg.n_layers // 2}.hook_resid_pre"
CORPUS = Path(interp_gpt.__file__).resolve().parents[1] / "data" / "corpus"  # in a source checkout
BOOKS = {"Shakespeare": CORPUS / "tinyshakespeare_input.txt", "Tolstoy": CORPUS / "warpeace_input.txt"}


def windows(path: Path, n: int = 400, n_tokens: int = 24) -> torch.Tensor:
    """n windows [n, 1 + n_tokens] of the book's held-out tail, BOS first."""
    _, (tail,) = split_corpus(path)
    ids = torch.tensor(model.tokenizer.encode(tail)[: n * n_tokens]).reshape(n, n_tokens)
    return torch.cat([torch.full((n, 1), model.tokenizer.bos_token_id), ids], dim=1)


S, T = windows(BOOKS["Shakespeare"]), windows(BOOKS["Tolstoy"])
print(f"hook {HOOK}; Shakespeare {tuple(S.shape)}, Tolstoy {tuple(T.shape)}")
print("a Shakespeare window:", repr(model.to_string(S[0, 1:])))
print("a Tolstoy window:    ", repr(model.to_string(T[0, 1:])))

# %% [markdown]
# ## 1 · A contrastive direction
#
# `contrastive_vector(model, pos_prompts, neg_prompts, hook)` runs both lists of prompts through
# the cache (padded on the right, each read at its own last real token) and returns the mean
# difference. Here the prompts are the first 200 windows of each book. On the 200 held-out windows
# of each book, we project the residual stream at the last position onto the direction.

# %%
v = contrastive_vector(
    model, [model.to_string(r[1:]) for r in S[:200]], [model.to_string(r[1:]) for r in T[:200]], HOOK
)
u = v / v.norm()
held_S = collect_activations(model, HOOK, S[200:], positions=-1)  # [200, d_model]
held_T = collect_activations(model, HOOK, T[200:], positions=-1)
proj_S, proj_T = held_S @ u, held_T @ u
threshold = (proj_S.mean() + proj_T.mean()) / 2
projection_accuracy = float(((proj_S > threshold).float().mean() + (proj_T <= threshold).float().mean()) / 2)
print(
    f"|v| = {v.norm():.3f}; held-out projection: Shakespeare {proj_S.mean():.3f} ± {proj_S.std():.3f}, "
    f"Tolstoy {proj_T.mean():.3f} ± {proj_T.std():.3f}"
)
print(f"held-out accuracy of the projection (threshold halfway between the means): {projection_accuracy:.3f}")

# %% [markdown]
# What to look at (tiny-gpt2): the two histograms overlap but are apart: Shakespeare's held-out
# windows project at 0.49 on average, Tolstoy's at -0.10, each with a spread of about 0.5, so the
# projection alone tells the books apart in 74% of held-out windows. One direction carries much of
# the variable, not all of it.

# %%
go.Figure(
    [
        go.Histogram(x=p.tolist(), name=name, opacity=0.6, nbinsx=40)
        for name, p in (("Shakespeare", proj_S), ("Tolstoy", proj_T))
    ],
    layout={
        "barmode": "overlay",
        "title": f"held-out windows projected on the contrastive direction at {HOOK}",
        "xaxis_title": "projection on v / |v|",
        "yaxis_title": "windows",
        "height": 380,
    },
).show()

# %% [markdown]
# ## 2 · A sparse probe
#
# `sparse_probing(features, labels, k)` is transformer-lens 4.3's sparse probe: a seeded split per
# class (30% held out), the `k` dimensions with the largest difference of class means on the
# training part, then a class-weighted logistic regression on those `k` alone. Its held-out accuracy
# says how many single residual dimensions the variable needs. On tiny-gpt2 one dimension (4) gives
# 62%, eight give 78% and 32 give 82%: the variable is spread over many dimensions, which is why a
# direction (section 1) or a learned subspace (section 3) reads it better than any single neuron.

# %%
features = torch.cat([held_S, held_T])
labels = torch.cat([torch.ones(len(held_S)), torch.zeros(len(held_T))]).long()  # 1: Shakespeare
probes = {k: sparse_probing(features, labels, k=k) for k in (1, 2, 4, 8, 32)}
for k, probe in probes.items():
    print(f"k = {k:2d}: held-out accuracy {probe.accuracy:.3f}, dimensions {probe.selected_features.tolist()[:8]}")

# %% [markdown]
# ## 3 · DAS: the direction that moves the prediction
#
# A probe finds where the variable can be *read*; it does not show that the model *uses* it.
# Interchange intervention does: run a Tolstoy window (the base), and inside a subspace `B` replace
# its residual stream with a Shakespeare window's (the source): `h + ((src - h) B) B^T`. If `B` holds
# the variable the model uses, the base run now predicts as the source does.
#
# The task: at the last position, does the model prefer ` thou` or ` Pierre`? On these windows it
# mostly prefers ` thou` on Shakespeare and ` Pierre` on Tolstoy. Pairs go both ways (Tolstoy base
# with Shakespeare source, and the reverse); the target is the source's own preference. `fit_das`
# learns a rank-1 basis on 400 training pairs; the 400 held-out pairs measure it. A change moved
# in a random direction by the same distance (`norm_matched_placebo`) is the control, and "chance" is
# the share of pairs whose base already predicts the source's answer.

# %%
ANSWERS = [model.to_single_token(w) for w in (" thou", " Pierre")]


def task(tokens: torch.Tensor) -> torch.Tensor:
    return model(tokens)[:, -1, ANSWERS]  # [batch, 2]


prefers_S, prefers_T = task(S).argmax(-1), task(T).argmax(-1)
print(
    f"' thou' preferred on {(prefers_S == 0).float().mean():.2f} of Shakespeare windows, "
    f"' Pierre' on {(prefers_T == 1).float().mean():.2f} of Tolstoy's"
)
order = torch.randperm(400, generator=torch.Generator().manual_seed(0))
train_base, train_source = torch.cat([T[:200], S[:200]])[order], torch.cat([S[:200], T[:200]])[order]
train_targets = torch.cat([prefers_S[:200], prefers_T[:200]])[order]
test_base, test_source = torch.cat([T[200:], S[200:]]), torch.cat([S[200:], T[200:]])
test_targets = torch.cat([prefers_S[200:], prefers_T[200:]])

das = fit_das(
    model, HOOK, train_base, train_source, train_targets, task, rank=1, epochs=10, batch_size=32, progress=False
)


def accuracy(answers: torch.Tensor) -> float:
    return float((answers.argmax(-1) == test_targets).float().mean())


results = {
    "chance (no intervention)": accuracy(task(test_base)),
    "DAS, rank 1": accuracy(interchange(model, HOOK, test_base, test_source, das.basis, task_logits=task)),
    "placebo (norm-matched)": accuracy(
        norm_matched_placebo(model, HOOK, test_base, test_source, das.basis, task_logits=task)
    ),
    "contrastive direction": accuracy(interchange(model, HOOK, test_base, test_source, u[:, None], task_logits=task)),
    "a random direction": accuracy(
        interchange(model, HOOK, test_base, test_source, random_basis(model.cfg.d_model, 1, seed=1), task_logits=task)
    ),
}
for name, value in results.items():
    print(f"{name:26s} {value:.3f}")
print(
    f"DAS loss {das.losses[0]:.3f} -> {das.losses[-1]:.3f}; cosine(DAS direction, contrastive direction) = "
    f"{float(das.basis[:, 0] @ u):.2f}"
)

# %% [markdown]
# What to look at (tiny-gpt2): without an intervention the base already gives the source's answer in
# 26% of held-out pairs (chance). Swapping the one DAS direction lifts that to 62%; the placebo,
# moving as far in a random direction, stays at chance (26%), and so does a random direction (25%).
# The contrastive direction, which was found without looking at the prediction, does less (45%): the
# two are related (cosine 0.73) but not the same. DAS finds the part of the book variable that the
# ` thou`/` Pierre` choice reads.

# %%
go.Figure(
    go.Bar(
        x=list(results), y=list(results.values()), text=[f"{r:.2f}" for r in results.values()], textposition="outside"
    ),
    layout={
        "title": "held-out interchange accuracy: the base run gives the source's answer",
        "yaxis_title": "accuracy",
        "yaxis_range": [0, 1],
        "height": 380,
    },
).show()

# %% [markdown]
# ## 4 · Steering
#
# `with steer(model, hook, vector, coeff=c):` adds `c * vector` at the hook in every forward pass in
# the block, and in `generate` with its KV cache (each new token goes through the hook once), and
# always takes the hook off again. Adding the contrastive direction should make Shakespeare's text
# more likely and Tolstoy's less; subtracting it, the reverse. We measure the model's loss on 64
# held-out windows of each book, steering every position after BOS (`positions=slice(1, None)`).

# %%
coeffs = [-4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0]
steered_loss: dict[str, list[float]] = {"Shakespeare": [], "Tolstoy": []}
for c in coeffs:
    with steer(model, HOOK, v, coeff=c, positions=slice(1, None)):
        steered_loss["Shakespeare"].append(float(model(S[200:264], return_type="loss")))
        steered_loss["Tolstoy"].append(float(model(T[200:264], return_type="loss")))
for i, c in enumerate(coeffs):
    gap = steered_loss["Tolstoy"][i] - steered_loss["Shakespeare"][i]
    print(
        f"coeff {c:+.0f}: loss Shakespeare {steered_loss['Shakespeare'][i]:.3f}, "
        f"Tolstoy {steered_loss['Tolstoy'][i]:.3f}, Tolstoy - Shakespeare {gap:+.3f}"
    )

# %% [markdown]
# What to look at (tiny-gpt2): both losses are lowest unsteered (4.08 and 4.14 nats): any push away
# from the model's own stream costs. But the push has a sign: at +4 Tolstoy's loss rises more than
# Shakespeare's (the gap Tolstoy - Shakespeare grows from +0.06 to +1.08), at -4 Shakespeare's does
# (the gap is -0.94). The direction is a dial between the books, not only noise.

# %%
go.Figure(
    [go.Scatter(x=coeffs, y=losses, mode="lines+markers", name=book) for book, losses in steered_loss.items()],
    layout={
        "title": f"loss on each book's held-out windows, steering {HOOK} by coeff x v",
        "xaxis_title": "coeff",
        "yaxis_title": "loss (nats / token)",
        "height": 380,
    },
).show()

# %% [markdown]
# The same dial in generation: greedy decoding is deterministic, so the same prompt gives one
# continuation per coefficient (the KV cache is on, as `generate`'s default). On tiny-gpt2, at -2 it
# writes about "the French army", unsteered about "the city", and at +1 it turns to verse ("The
# fools,\nAnd I'll not be a pardon").

# %%
for c in (-2.0, 0.0, 1.0):
    with steer(model, HOOK, v, coeff=c, positions=slice(1, None)):
        text = model.generate("The", max_new_tokens=24, do_sample=False, verbose=False)
    print(f"coeff {c:+.0f}: {text!r}")

# %% [markdown]
# ## 5 · Lenses: what each layer already predicts
#
# The logit lens reads the residual stream entering layer `l` through the final LayerNorm and the
# unembedding, as if the remaining layers did nothing. A tuned lens (tuned-lens' definition) first
# applies a learned affine translator per layer, `h + A_l h + b_l`, trained to minimise the KL
# divergence from the model's final distribution; its translators start at zero, so before training
# it *is* the logit lens. We train one on the books' training text (the first 90%), 150 steps of 8
# windows of 128 tokens, with tuned-lens' optimiser (SGD with Nesterov momentum, lr 0.1, linear
# decay). The Jacobian lens (transformer-lens 4.3's) is not trained but fitted: for each layer `l`,
# the average Jacobian `J_l` of the last layer's `resid_post` with respect to layer `l`'s, summed
# over later positions, here over 16 training windows; it reads `ln_final(J_l h)`. It reads
# `resid_post` of a layer below the last, so on a 2-layer model it reads the stream entering layer 1
# only. All three are measured on 32 held-out windows by KL(final || lens).

# %%
train_texts, val_texts = split_corpus(CORPUS)
torch.manual_seed(0)
tuned = fit_tuned_lens(model, train_texts, steps=150, batch_size=8, context_size=128, progress=False)
held_out = lens_windows(model, val_texts, context_size=128)[:32]
kl_logit = lens_kl(TunedLens.from_model(model), held_out)
kl_tuned = lens_kl(tuned, held_out)

jacobian = jacobian_lens(model, lens_windows(model, train_texts, context_size=64)[:16], skip_first_positions=16)
_, cache = model.run_with_cache(held_out, names_filter=lambda name: name.endswith("hook_resid_post"))
final = model(held_out).log_softmax(-1)  # the model's own distribution, [batch, pos, d_vocab]
kl_jacobian = torch.full((model.cfg.n_layers,), float("nan"))  # entering layer l reads resid_post l - 1
for source in jacobian.source_layers:
    lens_logprobs = jacobian(cache[f"blocks.{source}.hook_resid_post"], source).log_softmax(-1)
    kl_jacobian[source + 1] = (final.exp() * (final - lens_logprobs)).sum(-1).mean()
for layer in range(model.cfg.n_layers):
    print(
        f"entering layer {layer}: KL(final || lens) logit {kl_logit[layer]:.3f}, tuned {kl_tuned[layer]:.3f}, "
        f"Jacobian {kl_jacobian[layer]:.3f}"
    )

# %% [markdown]
# What to look at (tiny-gpt2): entering layer 0 the stream is just the token and position embeddings,
# and the logit lens reads them as a distribution far from the final one (13.4 nats); the tuned
# lens's translator brings that to 1.5 nats. Entering layer 1 the logit lens is already close
# (1.34 nats) and the tuned lens closer still (0.47). The tuned lens is below the logit lens
# at every layer: the intermediate layers hold the prediction in a basis the unembedding does not read
# directly. The Jacobian lens is *worse* than the logit lens here (1.60 nats entering layer 1): one
# linear map, averaged over positions and prompts, stands in for the whole last layer, and what this
# model's last layer adds (its induction heads copy tokens from earlier in the context) is not one
# linear map of the current position's stream. It has no bar entering layer 0 (it reads `resid_post`).

# %%
layers = [f"entering layer {layer}" for layer in range(model.cfg.n_layers)]
go.Figure(
    [
        go.Bar(x=layers, y=kl.tolist(), name=name, text=[f"{x:.2f}" for x in kl.tolist()], textposition="outside")
        for name, kl in (("logit lens", kl_logit), ("tuned lens", kl_tuned), ("Jacobian lens", kl_jacobian))
    ],
    layout={
        "title": "held-out KL(final || lens), entering each layer",
        "yaxis_title": "nats",
        "yaxis_type": "log",
        "height": 380,
    },
).show()

# %% [markdown]
# The same two lenses on one line of a play, layer by layer (rows) and position by position
# (columns): each cell is the lens's most likely next token, its colour the probability.
# `plots.logit_lens_heatmap(cache, str_tokens)` draws the logit lens; with `lens=tuned` it reads each
# `resid_pre` through the tuned lens instead (the last row, `final_post`, is the model's own output
# in both).
#
# What to look at (tiny-gpt2), the logit lens first: its row `0_pre` just repeats each position's own
# input token with probability 0.95 to 1.00 (the embedding read back through the unembedding), which
# is no prediction at all; its row `1_pre` still guesses `:` after `ROMEO:` (0.30) where the model
# ends at the newline (0.97).

# %%
PROMPT = "ROMEO:\nI will not go, my lord; the king is dead"
_, prompt_cache = model.run_with_cache(PROMPT)
prompt_tokens = model.to_str_tokens(PROMPT)
plots.logit_lens_heatmap(prompt_cache, prompt_tokens).show()

# %% [markdown]
# What to look at (tiny-gpt2): through the tuned lens, row `0_pre` already predicts: after `ROMEO`
# it gives `:` and after `ROMEO:` the newline (0.86; the model's final answer is the newline at 0.97),
# and row `1_pre` keeps it (0.76); after ` my`, row `1_pre` gives ` lord` (0.14), as the model does
# (0.43).

# %%
plots.logit_lens_heatmap(prompt_cache, prompt_tokens, lens=tuned).show()

# %% [markdown]
# ## What you saw
#
# - a contrastive direction separates the two books' held-out windows in 74% of cases, and a
#   sparse probe shows the variable is spread over many residual dimensions;
# - DAS found a direction whose interchange moves the ` thou`/` Pierre` prediction in 62% of held-out
#   pairs, where a norm-matched placebo stays at chance (26%);
# - steering with the contrastive direction turns a dial between the books in loss and in generated
#   text, through the KV cache;
# - a tuned lens trained in under a minute reads every intermediate layer better than the logit lens;
#   the Jacobian lens, a fitted linear map, does not on this model.
#
# To save the lens in tuned-lens' format: `tuned.save("my-lens")`; the command line has the same:
# `interp-gpt train-lens tiny-gpt2 --data data/corpus --out my-lens` and
# `interp-gpt lens tiny-gpt2 "PROMPT" --tuned my-lens`.
