# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · SAE architectures side by side
#
# The package has every SAE architecture of sae-lens 6.54, one small module each, by sae-lens'
# name. This notebook trains the eight trainable ones at a small budget and compares them, on a
# model's activations and on synthetic data with known features:
#
# 1. what each architecture is, and that each saves and loads in sae-lens' format;
# 2. all eight trained together on `tiny-gpt2`'s `blocks.1.hook_resid_pre`, from one model forward per
#    batch (`train_saes`), with settings chosen for a comparable L0;
# 3. each one saved, reloaded in its inference form, and evaluated on held-out text: explained
#    variance, CE loss recovered, KL, L0, dead and dense features;
# 4. the same architectures on synthetic data whose true features we know, with a planted
#    hierarchy: how well they recover the features (MCC, F1, shrinkage) and how much they absorb.
#
# The budget is a few hundred steps of 512 rows, so the whole notebook runs in about a minute on
# two CPU cores: the numbers compare the architectures at that budget, not at convergence.

# %%
MODEL_NAME = "tiny-gpt2"  # any GPT-2; d_in follows the model, the settings below were chosen on tiny-gpt2

# %% [markdown]
# ## 1 · The architectures
#
# | architecture | what it is |
# |---|---|
# | `standard` | ReLU features, trained with an L1 penalty weighted by each decoder row's norm |
# | `topk` | the k largest pre-activations per token, the rest zero |
# | `jumprelu` | ReLU above a learned per-feature threshold, trained with an L0 penalty through straight-through estimators |
# | `batchtopk` | k features per token *on average*: the k x batch largest over the whole batch; saved as `jumprelu` with the threshold it learned |
# | `matryoshka_batchtopk` | BatchTopK whose nested prefixes of features (here the first 64, 256, all) must each reconstruct the input; saved as `jumprelu` |
# | `gated` | one encoder decides which features fire (the gate), a rescaled copy how strongly (the magnitude) |
# | `abstopk` | the k pre-activations of largest magnitude, with their sign (features can be negative) |
# | `matching_pursuit` | tied weights; picks decoder rows greedily, one at a time, from what is left of the input |
# | `temporal` | attention over the earlier positions predicts part of the code, a sparse code does the rest; inference only (sae-lens has no trainer for it) |
#
# The registry says the same: which architectures train, which one sae-lens saves each as for
# inference, and the config fields each owns (with sae-lens' defaults).

# %%
import tempfile
from pathlib import Path

import plotly.graph_objects as go
import torch
from plotly.colors import qualitative
from plotly.subplots import make_subplots

import interp_gpt
from interp_gpt import GPT
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures import REGISTRY
from interp_gpt.sae.synthetic import absorption_score, evaluate_synthetic, planted_hierarchy_model
from interp_gpt.sae.training import (
    MultiSAETrainer,
    SAETrainingConfig,
    evaluate_sae,
    split_corpus,
    token_windows,
    train_saes,
)

torch.manual_seed(0)
# One thread: the numbers below then do not depend on the machine's core count (a split of some sums
# over threads changes their rounding, which matching pursuit's greedy choices can amplify); at these
# sizes more threads gain little.
torch.set_num_threads(1)
print(f"{'architecture':22s} {'trains':7s} {'saved as':17s} its own config fields (sae-lens' defaults)")
for name, arch in REGISTRY.items():
    saved_as = arch.saved_as or name
    fields = ", ".join(f"{k}={v!r}" for k, v in arch.fields.items()) or "-"
    print(f"{name:22s} {'yes' if arch.trainable else 'no':7s} {saved_as:17s} {fields}")
TRAINABLE = [name for name, arch in REGISTRY.items() if arch.trainable]


def table(rows: dict[str, dict[str, float]], columns: dict[str, str]) -> None:
    """Print one row per architecture, one column per metric (`columns`: metric -> its heading)."""
    print(f"{'':22s}" + "".join(f"{heading:>11s}" for heading in columns.values()))
    for name, row in rows.items():
        print(f"{name:22s}" + "".join(f"{row[key]:11.3f}" for key in columns))


# %% [markdown]
# ## 2 · Eight SAEs from one forward
#
# `train_saes(model, saes, texts, n_steps, cfg)` runs the activation store over the text: one
# forward of `tiny-gpt2` per batch of windows, whose `blocks.1.hook_resid_pre` rows go to every SAE.
# Each SAE keeps its own `SAETrainer` (optimiser, schedule, losses) and ends exactly as it would
# trained alone on the same batches. The settings, in one dict: 512 features (4 x d_model) each,
# k = 24 for the TopK family and at most 24 matching-pursuit steps, and L1 / L0 coefficients that
# bring standard, gated and JumpReLU to a similar L0. One learning rate for all (3e-3, decayed to
# 0 over the last quarter); 200 steps of 512 rows, about 100k tokens of the training text.

# %%
HOOK = "blocks.1.hook_resid_pre"
D_SAE, K = 512, 24
SETTINGS = {  # architecture -> (its SAEConfig fields, its SAETrainingConfig fields)
    "standard": ({}, {"l1_coefficient": 0.9}),
    "topk": ({"k": K}, {}),
    "jumprelu": ({}, {"l0_coefficient": 0.3, "jumprelu_init_threshold": 0.075}),
    "batchtopk": ({"k": K}, {}),
    "matryoshka_batchtopk": ({"k": K, "matryoshka_widths": [64, 256, D_SAE]}, {}),
    "gated": ({}, {"l1_coefficient": 1.25}),
    "abstopk": ({"k": K}, {}),
    "matching_pursuit": ({"max_iterations": K}, {}),
}
assert list(SETTINGS) == TRAINABLE, "one setting per trainable architecture"
N_STEPS, BATCH, LR = 200, 512, 3e-3

model = GPT.from_pretrained(MODEL_NAME)
CORPUS = Path(interp_gpt.__file__).resolve().parents[1] / "data" / "corpus"  # in a source checkout
train_texts, val_texts = split_corpus(CORPUS)
train_texts = [text[:150_000] for text in train_texts]  # the head of each book: ~100k tokens


def make_saes(settings: dict, d_in: int, d_sae: int, hook: str) -> dict[str, SAE]:
    """One fresh SAE per architecture of `settings`, with its own config fields."""
    return {
        name: SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture=name, metadata={"hook_name": hook}, **sae_kw))
        for name, (sae_kw, _) in settings.items()
    }


def training_configs(settings: dict, n_steps: int) -> dict[str, SAETrainingConfig]:
    """One training config per architecture: the learning rate decays to 0 over the last quarter."""
    return {
        name: SAETrainingConfig(lr=LR, lr_decay_steps=n_steps // 4, log_every=50, seed=0, **train_kw)
        for name, (_, train_kw) in settings.items()
    }


saes = make_saes(SETTINGS, model.cfg.d_model, D_SAE, HOOK)
cfgs = training_configs(SETTINGS, N_STEPS)
trainer = train_saes(model, saes, train_texts, N_STEPS, cfgs, batch_size=BATCH, keep_in_memory=True, progress=False)
print(f"trained {len(saes)} SAEs on {N_STEPS * BATCH} rows of {HOOK}; the last training log of each:")
table({name: log[-1] for name, log in trainer.logs.items()}, {"l0": "L0", "explained_variance": "expl. var"})

# %% [markdown]
# ## 3 · Saved in sae-lens' format, reloaded, evaluated
#
# `sae.save_model(folder)` writes sae-lens' `cfg.json` and `sae_weights.safetensors` (loadable by
# sae-lens' `SAE.load_from_disk`; the test suite checks each architecture against sae-lens itself),
# in sae-lens' inference form: BatchTopK and Matryoshka BatchTopK become the JumpReLU SAE whose
# threshold is the running threshold they learned, so a token's features no longer depend on the
# rest of its batch. `SAE.from_pretrained(folder)` reads it back. Below, for each: the architecture
# in its `cfg.json`, and the largest difference between the trained SAE's reconstruction and the
# reloaded one's on held-out activations (0 where the form is the same; for the two BatchTopK SAEs,
# the fixed threshold against the batch's own cut). The temporal SAE, which no trainer trains,
# makes the same round trip freshly initialised, on whole windows (it reads a sequence).

# %%
val_tokens = token_windows(model, val_texts, 128, max_windows=48)  # held out: the last 10% of each book
_, cache = model.run_with_cache(val_tokens[:8], names_filter=[HOOK])
acts = cache[HOOK]  # [8, 128, d_model]
temporal = make_saes({"temporal": ({"n_heads": 4, "kval_topk": K}, {})}, model.cfg.d_model, D_SAE, HOOK)
to_save = {**saes, **temporal}
reloaded = {}
with tempfile.TemporaryDirectory() as folder, torch.no_grad():
    print(f"{'architecture':22s} {'cfg.json says':22s} max |x_hat - reloaded x_hat|")
    for name, sae in to_save.items():
        sae.save_model(Path(folder) / name)
        reloaded[name] = SAE.from_pretrained(Path(folder) / name)
        diff = (sae(acts) - reloaded[name](acts)).abs().max()
        print(f"{name:22s} {reloaded[name].cfg.architecture:22s} {diff:.2e}")

# %% [markdown]
# `evaluate_sae(model, sae, tokens)` splices each reloaded SAE into the model at its hook and
# measures, on 48 held-out windows (6144 tokens): L0, explained variance, the CE loss recovered
# (1 = the clean model's loss, 0 = the loss with the activation zeroed), the KL divergence of the
# next-token distribution from the clean model's, and the share of dead features (never firing
# on these tokens) and dense ones (firing on more than 10% of them).

# %%
metrics = {name: evaluate_sae(model, reloaded[name], val_tokens) for name in SETTINGS}
ce = metrics["topk"]
print(f"CE loss: clean {ce['ce_clean']:.3f}, zero ablation {ce['ce_zero_ablation']:.3f}")
COLUMNS = {"l0": "L0", "explained_variance": "expl. var", "ce_loss_recovered": "CE rec.", "kl_div": "KL"}
table(metrics, {**COLUMNS, "dead_fraction": "dead", "dense_fraction": "dense"})

# %% [markdown]
# The same as a picture: the quality of the reconstruction against its sparsity, one point per
# architecture (up and to the left is better).
#
# What to look at (tiny-gpt2): matching pursuit stands apart, with the most explained variance
# (0.941) and CE loss recovered (0.966) at the lowest L0 (23.2). The TopK family, JumpReLU and gated
# sit together at 0.87 to 0.89 explained variance and 0.90 to 0.93 CE recovered, for L0 24 to 28.4
# (BatchTopK's 24 per token on average during training is 25.6 with its saved threshold, on
# held-out text). Standard, at L0 24.7, recovers 0.658 of the CE loss: at 200 steps the L1 SAE is
# the furthest behind (section 4 shows its shrinkage).

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=["explained variance", "CE loss recovered"])
for i, (name, m) in enumerate(metrics.items()):  # one trace per architecture, in both panels
    for col, key in enumerate(["explained_variance", "ce_loss_recovered"], start=1):
        fig.add_trace(
            go.Scatter(
                x=[m["l0"]],
                y=[m[key]],
                name=name,
                legendgroup=name,
                showlegend=col == 1,
                mode="markers",
                marker={"size": 12, "color": qualitative.Plotly[i % 10]},
            ),
            row=1,
            col=col,
        )
fig.update_xaxes(title_text="L0 (features per token)")
fig.update_layout(title=f"{len(metrics)} SAEs on {MODEL_NAME}'s {HOOK}, held-out text", height=450)
fig.show()

# %% [markdown]
# ## 4 · Synthetic ground truth, with a planted hierarchy
#
# On a model's activations nobody knows the true features; on synthetic data we do.
# `planted_hierarchy_model` builds activations `x = sum_i a_i d_i` from 44 known unit directions
# `d_i` in 32 dimensions (more features than dimensions: superposition): 4 *parents*, each with 4
# mutually exclusive *children* that fire only with their parent (70% of the time), and 24 free
# features; parents and free features fire 15% of the time. A good SAE has one latent per true
# feature. Its scores (`evaluate_synthetic`, sae-lens' definitions, on fresh samples):
#
# * MCC: the mean |cosine| between decoder rows and true directions, matched one to one;
# * F1: each latent as a detector of its best-matching feature (fires when the feature is active);
# * shrinkage: `||x_hat|| / ||x||` (below 1: the reconstruction is shrunk, as an L1 penalty does);
# * absorption (`absorption_score`): of the samples where a parent and one of its children are
#   active, the share where the parent's latent is silent while the child's latent fires: the
#   child's latent has *absorbed* the parent's direction (0 is best).
#
# The eight architectures train in lockstep (`MultiSAETrainer`) on one stream of samples, with a
# d_sae equal to the number of true features and settings for an L0 near the true one (about 4.8).

# %%
synthetic = planted_hierarchy_model(
    n_parents=4, n_children=4, n_free=24, hidden_dim=32, parent_probability=0.15, child_probability=0.7, seed=0
)
print(synthetic, "parents -> children:", synthetic.hierarchy.children_of())
N_FEATURES, SYN_K = synthetic.num_features, 5
SYNTHETIC_SETTINGS = {  # architecture -> (its SAEConfig fields, its SAETrainingConfig fields)
    "standard": ({}, {"l1_coefficient": 0.7}),
    "topk": ({"k": SYN_K}, {}),
    "jumprelu": ({}, {"l0_coefficient": 0.1, "jumprelu_init_threshold": 0.05}),
    "batchtopk": ({"k": SYN_K}, {}),
    "matryoshka_batchtopk": ({"k": SYN_K, "matryoshka_widths": [8, N_FEATURES]}, {}),
    "gated": ({}, {"l1_coefficient": 0.9}),
    "abstopk": ({"k": SYN_K}, {}),
    "matching_pursuit": ({"max_iterations": SYN_K}, {}),
}
assert list(SYNTHETIC_SETTINGS) == TRAINABLE
SYN_STEPS = 300
synthetic_saes = make_saes(SYNTHETIC_SETTINGS, synthetic.hidden_dim, N_FEATURES, "synthetic")
synthetic_trainer = MultiSAETrainer(synthetic_saes, training_configs(SYNTHETIC_SETTINGS, SYN_STEPS))
generator = torch.Generator().manual_seed(1)
samples = (synthetic.sample(BATCH, generator=generator) for _ in range(SYN_STEPS))
synthetic_trainer.train(samples, SYN_STEPS, progress=False)

scores = {}
with tempfile.TemporaryDirectory() as folder:
    for name, sae in synthetic_saes.items():
        sae.save_model(Path(folder) / name)  # scored in the inference form, as on tiny-gpt2
        inference = SAE.from_pretrained(Path(folder) / name)
        s = evaluate_synthetic(inference, synthetic, n_samples=20_000, seed=2)
        true_l0 = s["true_l0"]
        scores[name] = {
            "l0": s["sae_l0"],
            "mcc": s["mcc"],
            "f1": s["classification"]["f1_score"],
            "shrinkage": s["shrinkage"],
            "explained_variance": s["explained_variance"],
            "absorption": absorption_score(inference, synthetic, n_samples=20_000, seed=3)["absorption"],
        }
print(f"true L0 {true_l0:.2f}")
SYNTHETIC_COLUMNS = {"l0": "L0", "mcc": "MCC", "f1": "F1", "shrinkage": "shrinkage", "explained_variance": "expl. var"}
table(scores, {**SYNTHETIC_COLUMNS, "absorption": "absorption"})

# %% [markdown]
# What to look at: JumpReLU recovers the features best (MCC 0.950, F1 0.908) and absorbs least
# (0.042). TopK and AbsTopK absorb almost every parent-child event (0.930 and 0.952): their parent
# latents stay silent while a child's latent fires. Standard has the strongest shrinkage (0.663:
# its reconstructions are a third too short), gated the weakest (0.981).

# %%
fig = go.Figure(
    [
        go.Bar(name="MCC (higher is better)", x=list(scores), y=[s["mcc"] for s in scores.values()]),
        go.Bar(name="absorption (lower is better)", x=list(scores), y=[s["absorption"] for s in scores.values()]),
    ],
    layout={"title": "synthetic ground truth: feature recovery and absorption", "barmode": "group", "height": 420},
)
fig.show()

# %% [markdown]
# Matryoshka BatchTopK against BatchTopK (the same k, budget and samples; the only difference is
# the nested loss, here that its first 8 latents reconstruct on their own): Matryoshka's parent
# latents go silent in 12% of the parent-child events (absorption 0.121), BatchTopK's in 40%
# (0.396), and Matryoshka pays for it in recovery: MCC 0.874 against 0.933, F1 0.846 against 0.903,
# explained variance 0.902 against 0.957. One seed and 300 steps: this is one run, not a benchmark.
