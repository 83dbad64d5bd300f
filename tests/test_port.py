"""The port test: transformer-lens notebook code runs on interp_gpt with only the import changed.

Each snippet below is source text written as a transformer-lens (TL) user writes it, after the
steps of TL's Main Demo and Exploratory Analysis Demo and of ARENA 1.2 (induction heads): the
cache, hooks and ablations, patching, logit attribution, and reading circuits from the weights
(OV / QK circuits, FactoredMatrix, composition scores). It runs twice, with nothing changed but
its first line:

    from transformer_lens import HookedTransformer, FactoredMatrix, utils             # TL 3.9
    from interp_gpt import GPT as HookedTransformer, FactoredMatrix, utils            # ours

once on TL 3.9's HookedTransformer built from a random Hugging Face GPT-2 checkpoint (with
GPT-2's real tokenizer), once on our GPT loaded from the same checkpoint; both processed as
`from_pretrained` does by default. A notebook loads its model with `from_pretrained("gpt2")`,
which needs the hub, so the test hands both snippets a ready `model`. Each snippet leaves its
results in `out` (tensors, numbers, strings, lists and dicts of them); they must agree to the
parity suite's tolerances.

A few snippets import more, the package again the only change (EXTRA_IMPORTS: `evals`,
`head_detector.detect_head`, `HookedTransformerConfig`, ours `Config`); the weight-processing
snippet gets both models unprocessed, and ARENA 1.2's attention-only toy model is built by each
snippet from its config and a state dict TL saved. Besides the Main Demo, the Exploratory Analysis
Demo and ARENA 1.2, they cover `test_prompt` (its printout, as text), `lm_accuracy`, `to_numpy`,
`detect_head`, `evals`, `run_with_cache(pos_slice=...)` and `Slice`, `get_token_position`,
`to_str_tokens` on lists, the config and tokenizer surface TL's helpers read, and the weight
processing methods. KNOWN_DIFFERENCES marks (strict xfail) where a snippet still differs.

TL 3.9 is the last release with HookedTransformer: the port test runs in the 3.9 venv
(.venv-tl3) and skips beside transformer-lens 4.x.
"""

from __future__ import annotations

import copy
import json
import math
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import GPT, FactoredMatrix

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.parity

TL_IMPORT = "from transformer_lens import HookedTransformer, FactoredMatrix, utils"
OUR_IMPORT = "from interp_gpt import GPT as HookedTransformer, FactoredMatrix, utils"
# The parity suite's tolerances (tests/test_property_parity.py: logits 1e-4; compare's rtol 1e-4).
ATOL, RTOL = 1e-4, 1e-4

# The shape of the checkpoint: small, but GPT-2's whole vocabulary, so GPT-2's tokenizer fits it.
N_LAYERS, D_MODEL, N_HEADS, N_CTX, D_VOCAB = 2, 64, 4, 64, 50257


# ----------------------------------------------------------------------------
# The snippets
# ----------------------------------------------------------------------------
# Shared definitions some snippets start with (after the import line, in both runs).
IOI = """
import torch
import einops
from functools import partial

prompts = [
    "When John and Mary went to the shops, John gave the bag to",
    "When John and Mary went to the shops, Mary gave the bag to",
]
answers = [(" Mary", " John"), (" John", " Mary")]
answer_tokens = torch.tensor([[model.to_single_token(a) for a in pair] for pair in answers])
tokens = model.to_tokens(prompts, prepend_bos=True)


def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
    final_logits = logits[:, -1, :]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
    answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
    return answer_logit_diff if per_prompt else answer_logit_diff.mean()
"""

REPEATED = """
import torch
import einops
from functools import partial


def generate_repeated_tokens(model, seq_len, batch=1):
    generator = torch.Generator().manual_seed(0)
    prefix = (torch.ones(batch, 1) * model.tokenizer.bos_token_id).long()
    rep_tokens_half = torch.randint(0, model.cfg.d_vocab, (batch, seq_len), dtype=torch.int64, generator=generator)
    return torch.cat([prefix, rep_tokens_half, rep_tokens_half], dim=-1)
"""

SNIPPETS: dict[str, str] = {}

# TL Main Demo: loss, logits and the tokenizer helpers.
SNIPPETS["main_demo_loss_and_tokens"] = """
import torch

text = "Natural language processing tasks, such as question answering, are typically approached with supervised learning."
logits = model(text)
loss = model(text, return_type="loss")
logits_too, loss_too = model(text, return_type="both")
tokens = model.to_tokens(text)
out = dict(
    logits=logits,
    loss=loss,
    loss_too=loss_too,
    per_token=model(text, return_type="loss", loss_per_token=True),
    tokens=tokens,
    str_tokens=model.to_str_tokens(text),
    str_tokens_no_bos=model.to_str_tokens(text, prepend_bos=False),
    str_tokens_of_ids=model.to_str_tokens(tokens[0]),
    string=model.to_string(tokens[0, 1:]),
    single_token=model.to_single_token(" Ralph"),
    single_str_token=model.to_single_str_token(11),
    padded_batch=model.to_tokens(["Hello there, how are you?", "Hi"]),
    bos=model.tokenizer.bos_token_id,
    d_vocab=model.cfg.d_vocab,
)
"""

# TL Main Demo: run_with_cache and indexing the cache.
SNIPPETS["main_demo_run_with_cache"] = """
import torch

text = "Mechanistic interpretability is the study of reverse engineering neural networks."
tokens = model.to_tokens(text)
logits, cache = model.run_with_cache(tokens)
attention_pattern = cache["pattern", 0, "attn"]
out = dict(
    logits=logits,
    keys=sorted(cache.keys()),
    pattern=attention_pattern,
    same_as_full_name=torch.equal(cache["pattern", 1], cache["blocks.1.attn.hook_pattern"]),
    act_name=utils.get_act_name("pattern", 0),
    resid_post=cache["resid_post", 1],
    ln1_scale=cache["scale", 0, "ln1"],
    final_scale=cache["ln_final.hook_scale"],
    q=cache["q", 1],
    z=cache["z", 0],
    mlp_pre=cache["pre", 1],
    embed=cache["embed"],
    pos_embed=cache["pos_embed"],
    stacked=cache.stack_activation("pattern"),
    no_batch=cache.remove_batch_dim()["resid_pre", 1],
)
_, small_cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
out["filtered_keys"] = sorted(small_cache.keys())
_, unbatched = model.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_post"], remove_batch_dim=True)
out["remove_batch_dim"] = unbatched["resid_post", 0]
"""

# TL Main Demo: the stacked weights, and running part of the model.
SNIPPETS["main_demo_weights_and_layers"] = """
import torch

tokens = model.to_tokens("The weights are stacked across layers.")
resid = model(tokens, stop_at_layer=1)
out = dict(
    shapes={name: tuple(getattr(model, name).shape) for name in ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_O", "W_in", "W_out", "b_in", "W_E", "W_pos", "W_U", "b_U", "W_E_pos"]},
    W_Q=model.W_Q,
    W_O=model.W_O,
    W_in=model.W_in,
    b_U=model.b_U,
    block_W_Q=model.blocks[1].attn.W_Q,
    block_b_out=model.blocks[0].mlp.b_out,
    W_E_pos=model.W_E_pos,
    resid=resid,
    resumed=model(resid, start_at_layer=1),
    labels=model.all_head_labels(),
    bias=model.accumulated_bias(1),
    bias_mid=model.accumulated_bias(1, mlp_input=True),
    bias_no_mlp=model.accumulated_bias(2, include_mlp_biases=False),
)
"""

# TL Main Demo: ablating a head's value vectors with run_with_hooks.
SNIPPETS["main_demo_head_ablation"] = """
import torch

gpt2_text = "Natural language processing tasks, such as question answering, machine translation, reading comprehension."
gpt2_tokens = model.to_tokens(gpt2_text)
layer_to_ablate = 0
head_index_to_ablate = 2


def head_ablation_hook(value, hook):
    value[:, :, head_index_to_ablate, :] = 0.0
    return value


original_loss = model(gpt2_tokens, return_type="loss")
ablated_loss = model.run_with_hooks(
    gpt2_tokens, return_type="loss", fwd_hooks=[(utils.get_act_name("v", layer_to_ablate), head_ablation_hook)]
)
out = dict(original_loss=original_loss, ablated_loss=ablated_loss)
"""

# TL Main Demo: generation (greedy, so both runs are deterministic), from tokens and from text.
SNIPPETS["main_demo_generate_tokens"] = """
out = model.generate(model.to_tokens("Once upon a time"), max_new_tokens=5, do_sample=False, verbose=False)
"""
SNIPPETS["main_demo_generate_text"] = """
out = model.generate("The cat sat on the", max_new_tokens=8, do_sample=False, verbose=False)
"""

# TL Main Demo: FactoredMatrix on random factors.
SNIPPETS["main_demo_factored_matrix"] = """
import torch

generator = torch.Generator().manual_seed(0)
A = torch.randn(5, 2, generator=generator)
B = torch.randn(2, 5, generator=generator)
AB = A @ B
AB_factor = FactoredMatrix(A, B)
C = torch.randn(5, 300, generator=generator)
ABC_factor = AB_factor @ C
D_factor = FactoredMatrix(torch.randn(300, 3, generator=generator), torch.randn(3, 7, generator=generator))
U, S, Vh = AB_factor.svd()
batched = FactoredMatrix(torch.randn(3, 6, 4, generator=generator), torch.randn(3, 4, 6, generator=generator))
eigenvalues = AB_factor.eigenvalues
out = dict(
    AB=AB_factor.AB,
    BA=AB_factor.BA,
    norm=AB_factor.norm(),
    dims=(AB_factor.ldim, AB_factor.mdim, AB_factor.rdim, AB_factor.ndim, tuple(AB_factor.shape)),
    eigenvalues=eigenvalues,
    printed=str(AB_factor),
    S=AB_factor.S,
    reconstructed=U @ torch.diag(S) @ Vh.T,
    U_property_times_S=(AB_factor.U * AB_factor.S) @ AB_factor.Vh.T,
    ABC=ABC_factor.AB,
    ABC_shape=tuple(ABC_factor.shape),
    left_times=(C.T @ AB_factor).AB,
    ABCD=(ABC_factor @ D_factor).AB,
    transpose=AB_factor.T.AB,
    corner=AB_factor.get_corner(3),
    collapse_l_gram=AB_factor.collapse_l().T @ AB_factor.collapse_l(),
    collapse_r_gram=AB_factor.collapse_r() @ AB_factor.collapse_r().T,
    batched_S=batched.S,
    batched_norm=batched.norm(),
    batched_item=batched[1].AB,
    batched_rows=batched[:, 2:4].AB,
    pair_shapes=[tuple(t.shape) for t in batched.pair],
)
"""

# ARENA 1.2: induction scores from a hook on every attention pattern (hook.layer()).
SNIPPETS["arena_induction_score_hook"] = (
    REPEATED
    + """
seq_len = 20
rep_tokens = generate_repeated_tokens(model, seq_len, batch=4)
induction_score_store = torch.zeros((model.cfg.n_layers, model.cfg.n_heads))


def induction_score_hook(pattern, hook):
    induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
    induction_score = einops.reduce(induction_stripe, "batch head_index position -> head_index", "mean")
    induction_score_store[hook.layer(), :] = induction_score


pattern_hook_names_filter = lambda name: name.endswith("pattern")
model.run_with_hooks(rep_tokens, return_type=None, fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)])
out = dict(induction_score_store=induction_score_store, rep_tokens=rep_tokens)
"""
)

# ARENA 1.2: zero-ablating every head's hook_z in turn (functools.partial hooks).
SNIPPETS["arena_hook_z_ablation_scores"] = (
    REPEATED
    + """
def cross_entropy_loss(logits, tokens):
    log_probs = logits.log_softmax(dim=-1)
    correct_log_probs = log_probs[:, :-1].gather(dim=-1, index=tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return -correct_log_probs.mean()


def head_zero_ablation_hook(z, hook, head_index_to_ablate):
    z[:, :, head_index_to_ablate, :] = 0.0


def head_mean_ablation_hook(z, hook, head_index_to_ablate):
    z[:, :, head_index_to_ablate, :] = z[:, :, head_index_to_ablate, :].mean(0)


def get_ablation_scores(model, tokens, ablation_function=head_zero_ablation_hook):
    ablation_scores = torch.zeros((model.cfg.n_layers, model.cfg.n_heads))
    model.reset_hooks()
    loss_no_ablation = cross_entropy_loss(model(tokens, return_type="logits"), tokens)
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            temp_hook_fn = partial(ablation_function, head_index_to_ablate=head)
            ablated_logits = model.run_with_hooks(tokens, fwd_hooks=[(utils.get_act_name("z", layer), temp_hook_fn)])
            ablation_scores[layer, head] = cross_entropy_loss(ablated_logits, tokens) - loss_no_ablation
    return ablation_scores


rep_tokens = generate_repeated_tokens(model, 10, batch=2)
out = dict(
    zero=get_ablation_scores(model, rep_tokens),
    mean=get_ablation_scores(model, rep_tokens, head_mean_ablation_hook),
)
"""
)

# ARENA 1.2: direct logit attribution from the cache (per-head results opted in).
SNIPPETS["arena_logit_attribution"] = """
import torch
import einops

model.set_use_attn_result(True)
text = "We think that powerful, significantly superhuman machine intelligence is more likely than not to be created this century."
logits, cache = model.run_with_cache(text, remove_batch_dim=True)
tokens = model.to_tokens(text)[0]
embed = cache["embed"]
l1_results = cache["result", 0]
l2_results = cache["result", 1]


def logit_attribution(embed, l1_results, l2_results, W_U, tokens):
    W_U_correct_tokens = W_U[:, tokens[1:]]
    direct_attributions = einops.einsum(W_U_correct_tokens, embed[:-1], "emb seq, seq emb -> seq")
    l1_attributions = einops.einsum(W_U_correct_tokens, l1_results[:-1], "emb seq, seq nhead emb -> seq nhead")
    l2_attributions = einops.einsum(W_U_correct_tokens, l2_results[:-1], "emb seq, seq nhead emb -> seq nhead")
    return torch.concat([direct_attributions.unsqueeze(-1), l1_attributions, l2_attributions], dim=-1)


out = dict(attribution=logit_attribution(embed, l1_results, l2_results, model.W_U, tokens), l1_results=l1_results)
"""

# ARENA 1.2: OV and QK circuits read from the weights, as FactoredMatrix.
SNIPPETS["arena_ov_and_qk_circuits"] = """
import torch

layer, head_index = 1, 2
W_O = model.W_O[layer, head_index]
W_V = model.W_V[layer, head_index]
W_E = model.W_E
W_U = model.W_U
OV_circuit = FactoredMatrix(W_V, W_O)
full_OV_circuit = W_E @ OV_circuit @ W_U
indices = torch.randint(0, model.cfg.d_vocab, (200,), generator=torch.Generator().manual_seed(0))
full_OV_circuit_sample = full_OV_circuit[indices, indices].AB


def top_1_acc(full_OV_circuit, batch_size=1000):
    total = 0
    for indices in torch.split(torch.arange(full_OV_circuit.shape[0]), batch_size):
        AB_slice = full_OV_circuit[indices].AB
        total += (torch.argmax(AB_slice, dim=1) == indices).float().sum().item()
    return total / full_OV_circuit.shape[0]


# ARENA scores every row of the vocabulary; the first 1000 keep the test fast.
acc = top_1_acc(full_OV_circuit[:1000])
W_OV_both = FactoredMatrix(torch.cat([model.W_V[1, 0], model.W_V[1, 2]], dim=-1), torch.cat([model.W_O[1, 0], model.W_O[1, 2]], dim=-2))
acc_both = top_1_acc((W_E @ W_OV_both @ W_U)[:1000])

W_pos = model.W_pos
W_QK = model.W_Q[0, 1] @ model.W_K[0, 1].T
pos_by_pos_scores = W_pos @ W_QK @ W_pos.T


def mask_scores(attn_scores):
    mask = torch.tril(torch.ones_like(attn_scores)).bool()
    return attn_scores.masked_fill(~mask, attn_scores.new_tensor(-1.0e6))


pos_by_pos_pattern = torch.softmax(mask_scores(pos_by_pos_scores / model.cfg.d_head**0.5), dim=-1)


def find_K_comp_full_circuit(model, prev_token_head_index, ind_head_index):
    W_E = model.W_E
    W_Q = model.W_Q[1, ind_head_index]
    W_K = model.W_K[1, ind_head_index]
    W_O = model.W_O[0, prev_token_head_index]
    W_V = model.W_V[0, prev_token_head_index]
    Q = W_E @ W_Q
    K = W_E @ W_V @ W_O @ W_K
    return FactoredMatrix(Q, K.T)


K_comp_circuit = find_K_comp_full_circuit(model, 1, 2)
out = dict(
    full_OV_circuit_sample=full_OV_circuit_sample,
    full_OV_shape=tuple(full_OV_circuit.shape),
    acc=acc,
    acc_both=acc_both,
    pos_by_pos_pattern=pos_by_pos_pattern,
    previous_position=pos_by_pos_pattern.diag(-1).mean(),
    K_comp_acc=top_1_acc(K_comp_circuit.T[:1000]),
    K_comp_norm=K_comp_circuit.norm(),
)
"""

# ARENA 1.2 / TL Main Demo: every head's circuits at once, eigenvalue copying scores.
SNIPPETS["arena_all_heads_ov_qk_and_copying_scores"] = """
import torch

OV_circuit_all_heads = model.OV
OV_circuit_all_heads_eigenvalues = OV_circuit_all_heads.eigenvalues
OV_copying_score = OV_circuit_all_heads_eigenvalues.sum(dim=-1).real / OV_circuit_all_heads_eigenvalues.abs().sum(dim=-1)
full_OV_circuit = model.W_E @ model.OV @ model.W_U
full_OV_eigenvalues = full_OV_circuit.eigenvalues
out = dict(
    OV_shape=tuple(OV_circuit_all_heads.shape),
    QK_shape=tuple(model.QK.shape),
    OV_copying_score=OV_copying_score,
    full_OV_copying_score=full_OV_eigenvalues.sum(dim=-1).real / full_OV_eigenvalues.abs().sum(dim=-1),
    positive_fraction=(full_OV_eigenvalues.real > 0).float().mean(dim=-1),
    OV_S=OV_circuit_all_heads.S,
    QK_S=model.QK.S,
    OV_norm=model.OV.norm(),
    QK_1_2=model.QK[1, 2].AB,
    block_OV=model.blocks[1].attn.OV.AB,
    block_QK=model.blocks[0].attn.QK.AB,
)
"""

# ARENA 1.2: composition scores, by hand and from the model.
SNIPPETS["arena_composition_scores"] = """
import torch


def get_comp_score(W_A, W_B):
    W_A_norm = W_A.pow(2).sum().sqrt()
    W_B_norm = W_B.pow(2).sum().sqrt()
    W_AB_norm = (W_A @ W_B).pow(2).sum().sqrt()
    return (W_AB_norm / (W_A_norm * W_B_norm)).item()


W_OV = model.W_V @ model.W_O
W_QK = model.W_Q @ model.W_K.transpose(-1, -2)
composition_scores = {"Q": torch.zeros(model.cfg.n_heads, model.cfg.n_heads), "K": torch.zeros(model.cfg.n_heads, model.cfg.n_heads), "V": torch.zeros(model.cfg.n_heads, model.cfg.n_heads)}
for i in range(model.cfg.n_heads):
    for j in range(model.cfg.n_heads):
        composition_scores["Q"][i, j] = get_comp_score(W_OV[0, i], W_QK[1, j])
        composition_scores["K"][i, j] = get_comp_score(W_OV[0, i], W_QK[1, j].T)
        composition_scores["V"][i, j] = get_comp_score(W_OV[0, i], W_OV[1, j])
out = dict(
    by_hand=composition_scores,
    all_Q=model.all_composition_scores("Q"),
    all_K=model.all_composition_scores("K"),
    all_V=model.all_composition_scores("V"),
    utils_K=utils.composition_scores(model.OV[0], model.QK[1].T),
    utils_pairwise=utils.composition_scores(model.OV[0], model.OV[1], broadcast_dims=False),
)
"""

# TL Exploratory Analysis Demo: logit difference, logit lens and direct logit attribution.
SNIPPETS["exploratory_demo_logit_attribution"] = (
    IOI
    + """
original_logits, cache = model.run_with_cache(tokens)
original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)
answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
final_residual_stream = cache["resid_post", -1]
final_token_residual_stream = final_residual_stream[:, -1, :]
scaled_final_token_residual_stream = cache.apply_ln_to_stack(final_token_residual_stream, layer=-1, pos_slice=-1)
average_logit_diff = einops.einsum(
    scaled_final_token_residual_stream, logit_diff_directions, "batch d_model, batch d_model ->"
) / len(prompts)


def residual_stack_to_logit_diff(residual_stack, cache):
    scaled_residual_stack = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
    return einops.einsum(
        scaled_residual_stack, logit_diff_directions, "... batch d_model, batch d_model -> ..."
    ) / len(prompts)


accumulated_residual, labels = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
per_layer_residual, layer_labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
per_head_residual, head_labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
per_head_logit_diffs = einops.rearrange(
    residual_stack_to_logit_diff(per_head_residual, cache),
    "(layer head_index) -> layer head_index",
    layer=model.cfg.n_layers,
    head_index=model.cfg.n_heads,
)
full_decomposition, full_labels = cache.get_full_resid_decomposition(layer=-1, pos_slice=-1, apply_ln=True, return_labels=True)
out = dict(
    original_average_logit_diff=original_average_logit_diff,
    per_prompt=logits_to_ave_logit_diff(original_logits, answer_tokens, per_prompt=True),
    average_logit_diff=average_logit_diff,
    answer_residual_directions=answer_residual_directions,
    one_direction=model.tokens_to_residual_directions(" Mary"),
    logit_lens_logit_diffs=residual_stack_to_logit_diff(accumulated_residual, cache),
    labels=labels,
    per_layer_logit_diffs=residual_stack_to_logit_diff(per_layer_residual, cache),
    layer_labels=layer_labels,
    per_head_logit_diffs=per_head_logit_diffs,
    head_labels=head_labels,
    accumulated_resid_ln=cache.accumulated_resid(layer=1, apply_ln=True, pos_slice=-1),
    logit_attrs=cache.logit_attrs(per_layer_residual, tokens=answer_tokens[:, 0], incorrect_tokens=answer_tokens[:, 1], pos_slice=-1),
    full_decomposition=full_decomposition,
    full_labels=full_labels,
)
"""
)

# TL Exploratory Analysis Demo: activation patching of the residual stream, by hand.
SNIPPETS["exploratory_demo_residual_patching"] = (
    IOI
    + """
corrupted_prompts = []
for i in range(0, len(prompts), 2):
    corrupted_prompts.append(prompts[i + 1])
    corrupted_prompts.append(prompts[i])
corrupted_tokens = model.to_tokens(corrupted_prompts, prepend_bos=True)
original_logits, cache = model.run_with_cache(tokens)
corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens)


def patch_residual_component(corrupted_residual_component, hook, pos, clean_cache):
    corrupted_residual_component[:, pos, :] = clean_cache[hook.name][:, pos, :]
    return corrupted_residual_component


def patch_head_vector(corrupted_head_vector, hook, head_index, clean_cache):
    corrupted_head_vector[:, :, head_index, :] = clean_cache[hook.name][:, :, head_index, :]
    return corrupted_head_vector


patched_residual_stream_diff = torch.zeros(model.cfg.n_layers, tokens.shape[1])
for layer in range(model.cfg.n_layers):
    for position in range(tokens.shape[1]):
        hook_fn = partial(patch_residual_component, pos=position, clean_cache=cache)
        patched_logits = model.run_with_hooks(
            corrupted_tokens, fwd_hooks=[(utils.get_act_name("resid_pre", layer), hook_fn)], return_type="logits"
        )
        patched_residual_stream_diff[layer, position] = logits_to_ave_logit_diff(patched_logits, answer_tokens)

patched_head_z_diff = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
for layer in range(model.cfg.n_layers):
    for head_index in range(model.cfg.n_heads):
        hook_fn = partial(patch_head_vector, head_index=head_index, clean_cache=cache)
        patched_logits = model.run_with_hooks(
            corrupted_tokens, fwd_hooks=[(utils.get_act_name("z", layer, "attn"), hook_fn)], return_type="logits"
        )
        patched_head_z_diff[layer, head_index] = logits_to_ave_logit_diff(patched_logits, answer_tokens)
out = dict(
    clean=logits_to_ave_logit_diff(original_logits, answer_tokens),
    corrupted=logits_to_ave_logit_diff(corrupted_logits, answer_tokens),
    resid=patched_residual_stream_diff,
    head_z=patched_head_z_diff,
)
"""
)

# ARENA 1.3-style: forward and backward hooks added with add_hook (a name filter), then reset.
SNIPPETS["hooks_add_hook_and_gradients"] = (
    IOI
    + """
forward_cache = {}
grad_cache = {}


def forward_cache_hook(act, hook):
    forward_cache[hook.name] = act.detach()


def backward_cache_hook(act, hook):
    grad_cache[hook.name] = act.detach()


model.reset_hooks()
model.add_hook(lambda name: name.endswith("hook_resid_pre"), forward_cache_hook, "fwd")
model.add_hook(lambda name: name.endswith("hook_resid_pre"), backward_cache_hook, "bwd")
with torch.enable_grad():
    value = logits_to_ave_logit_diff(model(tokens), answer_tokens)
    value.backward()
model.reset_hooks()
after_reset = model(tokens)
out = dict(
    value=value.detach(),
    forward=forward_cache,
    grads=grad_cache,
    after_reset_calls=len(forward_cache),
    W_U_grad=model.W_U.grad,
)
"""
)

# TL Main Demo / Exploratory Analysis Demo: finding tokens, string tokens of lists and batches, the
# config and tokenizer surface TL's own helpers read.
SNIPPETS["main_demo_token_positions_and_tokenizer"] = """
import torch

prompt = "When John and Mary went to the shops, John gave the bag to Mary"
tokens = model.to_tokens(prompt)
batch = model.to_tokens(["Hello there, how are you?", "Hi"])
encoded = model.tokenizer("Hello there")
out = dict(
    first_john=model.get_token_position(" John", prompt),
    last_john=model.get_token_position(" John", prompt, mode="last"),
    mary_in_tokens=model.get_token_position(" Mary", tokens, mode="last"),
    mary_by_id=model.get_token_position(model.to_single_token(" Mary"), tokens[0]),
    no_bos=model.get_token_position(" John", prompt, prepend_bos=False),
    str_tokens_list=model.to_str_tokens(["Hello there", "General Kenobi"]),
    str_tokens_batch=model.to_str_tokens(list(batch)),
    str_tokens_row=model.to_str_tokens(batch[:1]),
    device=str(model.cfg.device),
    dtype=str(model.cfg.dtype),
    n_params=model.cfg.n_params,
    # Without the BOS TL 3.9's GPT-2 tokenizer adds to every encoding (README: a deliberate difference).
    input_ids=[i for i in encoded["input_ids"] if i != model.tokenizer.bos_token_id],
    ids_to_tokens=model.tokenizer.convert_ids_to_tokens([15496, 612, 11]),
    vocab_size=len(model.tokenizer.get_vocab()),
    special=(model.tokenizer.bos_token, model.tokenizer.eos_token),
    decode_one=model.tokenizer.decode(11),
    decode_list=model.tokenizer.decode(tokens[0, 1:].tolist()),
    batch_decode=model.tokenizer.batch_decode(batch[:, 1:4]),
    eos=model.tokenizer.eos_token_id,
    padding_side=model.tokenizer.padding_side,
)
"""

# TL Main Demo: test_prompt's printout, compared as text; next-token accuracy.
SNIPPETS["main_demo_test_prompt_and_accuracy"] = """
import contextlib
import io
import torch

printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    utils.test_prompt("After John and Mary went to the store, John gave a bottle of milk to", " Mary", model)
    utils.test_prompt("The cat sat on the", "mat", model, prepend_space_to_answer=True, top_k=3)
    utils.test_prompt("The capital of France is", [" Paris", " London"], model, top_k=2)
tokens = model.to_tokens(["The cat sat on the mat", "A dog barked"])
logits = model(tokens)
out = dict(
    printed=printed.getvalue(),
    accuracy=utils.lm_accuracy(logits, tokens),
    per_token=utils.lm_accuracy(logits, tokens, per_token=True),
    to_numpy=torch.from_numpy(utils.to_numpy(logits[0, :2, :5])),
    to_numpy_list=torch.from_numpy(utils.to_numpy([[1, 2], [3, 4]])),
)
"""

# TL Exploratory Analysis Demo / head_detector: scoring every head against TL's built-in patterns and a
# custom one (on this random model the scores are small; the comparison is what counts).
SNIPPETS["head_detector_detect_head"] = """
import torch

sequence = "one two three four one two three four five six"
tokens = model.to_tokens(sequence)
seq_len = tokens.shape[1]
custom = torch.tril(torch.ones(seq_len, seq_len)) / torch.arange(1, seq_len + 1)[:, None]
_, cache = model.run_with_cache(sequence, remove_batch_dim=True)
out = dict(
    previous=detect_head(model, sequence, "previous_token_head"),
    duplicate=detect_head(model, [sequence, "a b a b a b"], "duplicate_token_head"),
    induction=detect_head(model, sequence, "induction_head", exclude_bos=True),
    current_excluded=detect_head(model, sequence, "previous_token_head", exclude_current_token=True),
    custom=detect_head(model, sequence, custom, error_measure="abs"),
    some_heads=detect_head(model, sequence, "previous_token_head", heads=[(0, 1), (1, 3)]),
    layer_to_heads=detect_head(model, sequence, "previous_token_head", heads={1: [0, 2]}),
    from_cache=detect_head(model, sequence, "previous_token_head", cache=cache),
)
"""

# TL's evals: the induction loss on repeated random tokens (`device` passed as a CPU notebook passes
# it: TL's default is "cuda"), TL's IOI dataset (its templates, names and seeded draws).
SNIPPETS["evals_induction_loss_and_ioi_dataset"] = """
import torch

torch.manual_seed(0)
induction = evals.induction_loss(model, batch_size=3, subseq_len=20, device="cpu")
bos = model.tokenizer.bos_token_id
dataset = evals.IOIDataset(model.tokenizer, num_samples=12, seed=42)
symmetric = evals.IOIDataset(model.tokenizer, num_samples=8, symmetric=True, seed=1)
out = dict(
    induction_loss=induction,
    n=len(dataset),
    # Without their BOS tokens: TL 3.9 gives each its own GPT-2 tokenizer's BOS as well (see evals_ioi_eval).
    samples=[{key: value[value != bos] for key, value in dataset[i].items()} for i in range(len(dataset))],
    symmetric=[{key: value[value != bos] for key, value in symmetric[i].items()} for i in range(len(symmetric))],
)
"""

# TL's IOI eval on TL's IOI dataset: the logit difference and accuracy of the indirect object.
SNIPPETS["evals_ioi_eval"] = """
dataset = evals.IOIDataset(model.tokenizer, num_samples=12, seed=42)
out = dict(
    ioi=evals.ioi_eval(model, dataset=dataset, batch_size=4),
    ioi_symmetric=evals.ioi_eval(model, dataset=evals.IOIDataset(model.tokenizer, num_samples=8, symmetric=True, seed=1), batch_size=8, symmetric=True),
)
"""

# ARENA / TL: caching only some positions with pos_slice (an int, a range, a Slice), and utils.Slice.
SNIPPETS["run_with_cache_pos_slice"] = """
import torch

tokens = model.to_tokens("The quick brown fox jumps over the lazy dog")
_, last = model.run_with_cache(tokens, pos_slice=-1)
_, middle = model.run_with_cache(tokens, pos_slice=utils.Slice((2, 5)))
_, picked = model.run_with_cache(tokens, pos_slice=[1, 3, 4], names_filter=lambda name: "resid" in name or "pattern" in name)
full = model.run_with_cache(tokens)[1]
s = utils.Slice((1, 6, 2))
out = dict(
    last_resid=last["resid_post", 1],
    last_pattern=last["pattern", 0],
    last_q=last["q", 1],
    last_keys=sorted(last.keys()),
    middle_resid=middle["resid_pre", 0],
    middle_pattern=middle["pattern", 1],
    middle_z=middle["z", 0],
    picked=picked["resid_mid", 1],
    picked_keys=sorted(picked.keys()),
    slice_apply=s.apply(full["resid_post", 0], dim=1),
    slice_indices=s.indices(10).tolist(),
    int_slice=utils.Slice(-1).apply(full["embed"], dim=1),
)
"""

# TL Main Demo: weight processing as methods, on a model loaded without it (from_pretrained_no_processing).
SNIPPETS["weight_processing_methods"] = """
import copy
import torch

tokens = model.to_tokens("Weight processing changes the weights, not the log-probabilities.")
raw_log_probs = model(tokens).log_softmax(-1)
state_dict = {name: value.clone() for name, value in model.state_dict().items()}
folded = model.fold_layer_norm({name: value.clone() for name, value in state_dict.items()})
folded_no_centre = model.fold_layer_norm({name: value.clone() for name, value in state_dict.items()}, center_weights=False)
refactored = model.refactor_factored_attn_matrices({name: value.clone() for name, value in state_dict.items()})
weights = ["blocks.0.attn.W_Q", "blocks.1.attn.b_K", "blocks.0.attn.W_V", "blocks.1.attn.W_O", "blocks.1.attn.b_O", "blocks.0.mlp.W_in", "blocks.1.mlp.b_in", "unembed.W_U", "unembed.b_U"]
processed = copy.deepcopy(model)
processed.process_weights_()
refactored_model = copy.deepcopy(model)
refactored_model.process_weights_(refactor_factored_attn_matrices=True)
out = dict(
    folded={name: folded[name] for name in weights},
    folded_no_centre={name: folded_no_centre[name] for name in weights},
    refactored_QK=(refactored["blocks.1.attn.W_Q"] @ refactored["blocks.1.attn.W_K"].transpose(-1, -2)),
    refactored_W_O=refactored["blocks.0.attn.W_O"],
    processed_log_probs=processed(tokens).log_softmax(-1),
    raw_log_probs=raw_log_probs,
    processed_weights={name: processed.state_dict()[name] for name in weights},
    # An SVD fixes its singular vectors only up to sign: compare what the refactoring keeps (QK, OV, the
    # biases it moves) and the norms of what it makes (TL's W_O has orthonormal rows).
    refactored_model_QK=refactored_model.QK.AB,
    refactored_model_OV=refactored_model.OV.AB,
    refactored_b_O=refactored_model.b_O,
    refactored_W_Q_norms=refactored_model.W_Q.norm(dim=-2),
    refactored_W_O_norms=refactored_model.W_O.norm(dim=-1),
    refactored_log_probs=refactored_model(tokens).log_softmax(-1),
)
"""

# ARENA 1.2: the 2-layer attention-only induction model (no LayerNorm, shortformer positions), built from
# its config and loaded from its saved weights (here a smaller random one TL saved), then its induction scores.
SNIPPETS["arena_attn_only_toy_model"] = """
import torch
import einops

cfg = HookedTransformerConfig(
    d_model=64,
    d_head=16,
    n_heads=4,
    n_layers=2,
    n_ctx=64,
    d_vocab=500,
    attn_only=True,
    normalization_type=None,
    positional_embedding_type="shortformer",
    use_attn_result=True,
)
model = HookedTransformer(cfg)
model.load_state_dict(pretrained_weights)
model.eval()

seq_len = 12
generator = torch.Generator().manual_seed(0)
half = torch.randint(0, cfg.d_vocab, (2, seq_len), generator=generator)
rep_tokens = torch.cat([torch.zeros(2, 1, dtype=torch.long), half, half], dim=-1)
rep_logits, rep_cache = model.run_with_cache(rep_tokens)
induction_scores = torch.zeros(cfg.n_layers, cfg.n_heads)
for layer in range(cfg.n_layers):
    stripe = rep_cache["pattern", layer].diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
    induction_scores[layer] = einops.reduce(stripe, "batch head_index position -> head_index", "mean")
out = dict(
    logits=rep_logits,
    keys=sorted(rep_cache.keys()),
    induction_scores=induction_scores,
    result=rep_cache["result", 1],
    pos_embed=rep_cache["pos_embed"],
    n_params=cfg.n_params,
    OV=model.OV.AB,
    QK=model.QK[0].AB,
)
"""

# ARENA 1.2's config word for word: it also passes `attention_dir="causal"` and `seed=398`; its
# `tokenizer_name="EleutherAI/gpt-neox-20b"` needs that tokenizer on disk (see arena_config_tokenizer_name).
SNIPPETS["arena_attn_only_toy_model_arenas_config"] = SNIPPETS["arena_attn_only_toy_model"].replace(
    "    attn_only=True,\n", '    attention_dir="causal",\n    attn_only=True,\n    seed=398,\n'
)
assert SNIPPETS["arena_attn_only_toy_model_arenas_config"] != SNIPPETS["arena_attn_only_toy_model"]


# ARENA 1.2's config names its tokenizer (`tokenizer_name="EleutherAI/gpt-neox-20b"`); here a folder holding the
# tokenizer Hugging Face saved (offline): both build the model with it. The weights are drawn per parameter
# in named_parameters() order, so equal orders give equal models.
SNIPPETS["arena_config_tokenizer_name"] = """
import torch

cfg = HookedTransformerConfig(
    d_model=64, d_head=16, n_heads=4, n_layers=2, n_ctx=64, d_vocab=50257, attn_only=True,
    normalization_type=None, positional_embedding_type="shortformer", tokenizer_name=tokenizer_folder,
)
model = HookedTransformer(cfg)
generator = torch.Generator().manual_seed(0)
with torch.no_grad():
    for name, parameter in model.named_parameters():
        parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
tokens = model.to_tokens("The cat sat on the mat")
out = dict(
    names=[name for name, _ in model.named_parameters()],
    bos=model.tokenizer.bos_token_id,
    tokens=tokens,
    str_tokens=model.to_str_tokens("The cat sat"),
    logits=model(tokens),
    generated=model.generate("The cat", max_new_tokens=5, do_sample=False, verbose=False),
)
"""

# TL Main Demo: a hooked module of one's own (HookedRootModule, setup()), its cache and a patch.
SNIPPETS["main_demo_hooked_root_module"] = """
import torch
import torch.nn as nn


class SquareThenAdd(nn.Module):
    def __init__(self, offset):
        super().__init__()
        self.offset = nn.Parameter(torch.tensor(offset))
        self.hook_square = HookPoint()

    def forward(self, x):
        square = self.hook_square(x * x)
        return self.offset + square


class TwoLayerModel(HookedRootModule):
    def __init__(self):
        super().__init__()
        self.layer1 = SquareThenAdd(3.0)
        self.layer2 = SquareThenAdd(-4.0)
        self.hook_in = HookPoint()
        self.hook_mid = HookPoint()
        self.hook_out = HookPoint()
        super().setup()

    def forward(self, x):
        x_in = self.hook_in(x)
        x_mid = self.hook_mid(self.layer1(x_in))
        x_out = self.hook_out(self.layer2(x_mid))
        return x_out


model = TwoLayerModel()
out_value, cache = model.run_with_cache(torch.tensor(5.0))
seen = []


def set_to_zero_hook(tensor, hook):
    seen.append(hook.name)
    return torch.tensor(0.0)


patched = model.run_with_hooks(torch.tensor(5.0), fwd_hooks=[("layer2.hook_square", set_to_zero_hook)])
out = dict(
    output=out_value.item(),
    cache=[(key, cache[key].item()) for key in cache],
    patched=patched.item(),
    seen=seen,
    hook_names=sorted(model.hook_dict),
    n_hook_points=len(list(model.hook_points())),
)
"""

# TL Main Demo / ARENA: utils.get_device, utils.get_corner, model.loss_fn (per token, with a mask), to_string
# of one id, cache keys and act names with 0-d tensor layers (a loop over torch.arange), named_parameters'
# order, FactoredMatrix's printed form and eigenvalues (unsorted: the same order from the same factors; torch.linalg.eig
# may order a spectrum differently when the weights differ in their last bits, as processed ones can), and a pattern
# cached with stop_at_layer and names_filter equal bit for bit to the same pattern from a full run.
SNIPPETS["main_demo_utils_loss_and_indices"] = """
import torch

device = utils.get_device()
tokens = model.to_tokens(["The cat sat on the mat", "A dog"])
attention_mask = (torch.arange(tokens.shape[1]) < torch.tensor([[7], [3]])).long()
logits = model(tokens, attention_mask=attention_mask)
_, cache = model.run_with_cache(tokens[:1])
patterns = [cache["attn", layer] for layer in torch.arange(model.cfg.n_layers)]
heads = [cache["z", layer][:, :, head] for layer in torch.arange(model.cfg.n_layers) for head in torch.arange(2)]
_, first_layer = model.run_with_cache(tokens[:1], stop_at_layer=1, names_filter=[utils.get_act_name("pattern", 0)])
OV = model.OV
out = dict(
    device_kind=type(device).__name__,
    loss=model.loss_fn(logits, tokens),
    loss_masked=model.loss_fn(logits, tokens, attention_mask=attention_mask),
    loss_per_token=model.loss_fn(logits, tokens, attention_mask=attention_mask, per_token=True),
    corner=utils.get_corner(logits, 2),
    corner_factored=utils.get_corner(OV[1, 2], 3).AB,
    one_id=model.to_string(256),
    one_id_tensor=model.to_string(torch.tensor(256)),
    patterns=patterns,
    heads=heads,
    act_name=utils.get_act_name("pattern", torch.tensor(1)),
    bit_identical=torch.equal(first_layer["pattern", 0], cache["pattern", 0]),
    stop_at_layer_keys=list(first_layer.keys()),
    names=[name for name, _ in model.named_parameters()],
    printed=repr(OV),
    printed_one=str(OV[0, 1]),
    eigenvalues=OV.eigenvalues,
)
"""

# Snippets that import more than the first line: (transformer-lens' line, ours). Only the package changes.
EXTRA_IMPORTS: dict[str, tuple[str, str]] = {
    "head_detector_detect_head": (
        "from transformer_lens.head_detector import detect_head",
        "from interp_gpt.head_detector import detect_head",
    ),
    "evals_induction_loss_and_ioi_dataset": ("from transformer_lens import evals", "from interp_gpt import evals"),
    "evals_ioi_eval": ("from transformer_lens import evals", "from interp_gpt import evals"),
    "arena_attn_only_toy_model": (
        "from transformer_lens import HookedTransformerConfig",
        "from interp_gpt import Config as HookedTransformerConfig",
    ),
}
EXTRA_IMPORTS["arena_attn_only_toy_model_arenas_config"] = EXTRA_IMPORTS["arena_attn_only_toy_model"]
EXTRA_IMPORTS["arena_config_tokenizer_name"] = EXTRA_IMPORTS["arena_attn_only_toy_model"]
EXTRA_IMPORTS["main_demo_hooked_root_module"] = (
    "from transformer_lens.hook_points import HookedRootModule, HookPoint",
    "from interp_gpt.hooks import HookedRootModule, HookPoint",
)
# Snippets given the checkpoint loaded without weight processing (from_pretrained_no_processing).
UNPROCESSED = {"weight_processing_methods"}
# Snippets that build their own model and are given TL's saved toy-model weights (`pretrained_weights`).
TOY_WEIGHTS = {"arena_attn_only_toy_model", "arena_attn_only_toy_model_arenas_config"}
# Snippets that build their own model with the tokenizer of a folder (`tokenizer_folder`), or need no model.
OWN_MODEL = {"arena_config_tokenizer_name", "main_demo_hooked_root_module"}


# ----------------------------------------------------------------------------
# Running a snippet, comparing the outputs
# ----------------------------------------------------------------------------
def import_lines(name: str, ours: bool) -> str:
    """The import line(s) SNIPPETS[name] starts with: TL's, or ours."""
    lines = [OUR_IMPORT if ours else TL_IMPORT]
    if name in EXTRA_IMPORTS:
        lines.append(EXTRA_IMPORTS[name][1 if ours else 0])
    return "\n".join(lines)


def run_snippet(import_line: str, name: str, model: Any, **given: Any) -> Any:
    """Execute SNIPPETS[name] after `import_line`, with `model` (and `given`) defined, and return its `out`."""
    source = import_line + "\n" + textwrap.dedent(SNIPPETS[name])
    namespace: dict[str, Any] = {"model": model, "__name__": f"snippet_{name}", **given}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TL 3.9 deprecates HookedTransformer; .Vh warns on ours
        exec(compile(source, f"<snippet {name}>", "exec"), namespace)  # noqa: S102
    assert "out" in namespace, f"snippet {name} must leave its results in `out`"
    return namespace["out"]


def differences(ours: Any, theirs: Any, where: str = "out") -> list[str]:
    """Every place where `ours` and `theirs` differ: tensors beyond ATOL / RTOL (or in shape or
    kind), numbers beyond the same tolerance, anything else unequal (types included)."""
    if isinstance(theirs, torch.Tensor):
        if not isinstance(ours, torch.Tensor):
            return [f"{where}: {type(ours).__name__} here, a tensor from transformer-lens"]
        if ours.shape != theirs.shape:
            return [f"{where}: shape {tuple(ours.shape)} here, {tuple(theirs.shape)} from transformer-lens"]
        if ours.is_complex() != theirs.is_complex() or ours.is_floating_point() != theirs.is_floating_point():
            return [f"{where}: dtype {ours.dtype} here, {theirs.dtype} from transformer-lens"]
        if not (ours.is_floating_point() or ours.is_complex()):
            return [] if torch.equal(ours, theirs) else [f"{where}: integer tensors differ"]
        a, b = (
            ours.detach().to(torch.complex128 if ours.is_complex() else torch.float64),
            theirs.detach().to(torch.complex128 if theirs.is_complex() else torch.float64),
        )
        bad = ~torch.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
        if bad.any():
            return [
                f"{where}: {int(bad.sum())} of {bad.numel()} values differ, max |diff| {float((a - b).abs().max()):.3g}"
            ]
        return []
    if isinstance(theirs, bool) or not isinstance(theirs, (int, float)):
        if isinstance(theirs, dict):
            if not isinstance(ours, dict) or set(ours) != set(theirs):
                keys = sorted(ours) if isinstance(ours, dict) else type(ours).__name__
                return [f"{where}: keys {keys} here, {sorted(theirs)} from transformer-lens"]
            return [d for key in theirs for d in differences(ours[key], theirs[key], f"{where}[{key!r}]")]
        if isinstance(theirs, (list, tuple)):
            if type(ours) is not type(theirs) or len(ours) != len(theirs):
                return [f"{where}: {type(ours).__name__} of {len(ours)} here, {type(theirs).__name__} of {len(theirs)}"]
            return [
                d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in differences(a, b, f"{where}[{i}]")
            ]
        return [] if type(ours) is type(theirs) and ours == theirs else [f"{where}: {ours!r} here, {theirs!r} from TL"]
    if isinstance(ours, bool) or not isinstance(ours, (int, float)):
        return [f"{where}: {ours!r} here, the number {theirs!r} from transformer-lens"]
    if isinstance(theirs, int) and isinstance(ours, int):
        return [] if ours == theirs else [f"{where}: {ours} here, {theirs} from transformer-lens"]
    return [] if math.isclose(ours, theirs, rel_tol=RTOL, abs_tol=ATOL) else [f"{where}: {ours} here, {theirs} from TL"]


# ----------------------------------------------------------------------------
# The two models, from one checkpoint
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    """The snippets run ~200 forward passes on tensors of a few thousand numbers, where torch's
    thread pool costs more than it saves (40x on a busy 2-core machine): one thread, then restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, gpt2_vocab_dir: Path) -> dict[str, Any]:
    """A random GPT-2 checkpoint with GPT-2's vocabulary (LayerNorm weights and every bias
    perturbed, so weight processing has work to do), saved with GPT-2's tokenizer beside it."""
    hf_cfg = transformers.GPT2Config(
        n_layer=N_LAYERS, n_head=N_HEADS, n_embd=D_MODEL, n_positions=N_CTX, n_ctx=N_CTX, vocab_size=D_VOCAB
    )
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("port_gpt2")
    hf_model.save_pretrained(folder)
    vocab = json.loads((gpt2_vocab_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (gpt2_vocab_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    tokenizer = transformers.GPT2TokenizerFast(vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line])
    tokenizer.save_pretrained(folder / "tokenizer")
    return {"hf_model": hf_model, "folder": folder}


def _tl_hooked_transformer(request: pytest.FixtureRequest, processed: bool) -> Any:
    """TL 3.9's HookedTransformer of the checkpoint: processed as its from_pretrained does by default,
    or not at all (as from_pretrained_no_processing)."""
    pytest.importorskip("transformer_lens")
    from interp_gpt.compare import transformer_lens_major

    if transformer_lens_major() >= 4:
        pytest.skip(
            "transformer-lens 4.x has no HookedTransformer: the port test runs in the transformer-lens 3.9 venv "
            "(.venv-tl3; CI runs both)"
        )
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    checkpoint = request.getfixturevalue("checkpoint")  # after the skip: no checkpoint to build beside TL 4
    hf_model = checkpoint["hf_model"]
    cfg = HookedTransformerConfig(
        n_layers=N_LAYERS,
        d_model=D_MODEL,
        n_ctx=N_CTX,
        d_head=D_MODEL // N_HEADS,
        n_heads=N_HEADS,
        d_mlp=4 * D_MODEL,
        d_vocab=D_VOCAB,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=hf_model.config.layer_norm_epsilon,
        original_architecture="GPT2LMHeadModel",
    )
    # A tokenizer loaded from a folder: TL re-loads it by name to add a BOS token, offline from there.
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint["folder"] / "tokenizer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # HookedTransformer is deprecated in 3.9
        model = HookedTransformer(cfg, tokenizer=tokenizer)
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf_model, cfg),
        fold_ln=processed,
        center_writing_weights=processed,
        center_unembed=processed,
        fold_value_biases=processed,
    )
    return model.eval()


@pytest.fixture(scope="module")
def tl_prototype(request: pytest.FixtureRequest) -> Any:
    """TL 3.9's HookedTransformer of the checkpoint, processed as its from_pretrained does by default."""
    return _tl_hooked_transformer(request, processed=True)


@pytest.fixture(scope="module")
def tl_unprocessed(request: pytest.FixtureRequest) -> Any:
    return _tl_hooked_transformer(request, processed=False)


@pytest.fixture(scope="module")
def our_prototype(checkpoint: dict[str, Any]) -> GPT:
    """Our GPT from the same checkpoint folder, as a user loads it (processed by default; GPT-2's
    tokenizer, which `from_pretrained` attaches to a 50,257-token checkpoint)."""
    model = GPT.from_pretrained(checkpoint["folder"])
    assert model.tokenizer is not None
    return model.eval()


@pytest.fixture(scope="module")
def our_unprocessed(checkpoint: dict[str, Any]) -> GPT:
    return GPT.from_pretrained_no_processing(checkpoint["folder"]).eval()


@pytest.fixture(scope="module")
def toy_weights(tl_prototype: Any) -> dict[str, torch.Tensor]:
    """The state dict of a random attention-only, LayerNorm-free, shortformer model, as TL 3.9 saves it
    (ARENA 1.2's induction model, smaller), every parameter random (biases too)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        d_model=64, d_head=16, n_heads=4, n_layers=2, n_ctx=64, d_vocab=500, attention_dir="causal", attn_only=True,
        seed=398, use_attn_result=True, normalization_type=None, positional_embedding_type="shortformer",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    return {name: value.clone() for name, value in model.state_dict().items()}


# Where a snippet shows a difference from transformer-lens still to fix (strict: passing fails it).
KNOWN_DIFFERENCES: dict[str, str] = {
    "evals_ioi_eval": (
        "deliberate (README 'Evals and head detection'): TL 3.9's GPT-2 tokenizer adds a BOS, and its IOIDataset "
        "prepends another, so each prompt starts with two; ours (as TL 4.3) has one, and the logit differences differ"
    ),
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_DIFFERENCES[name]))
        if name in KNOWN_DIFFERENCES
        else name
        for name in sorted(SNIPPETS)
    ],
)
def test_snippet_gives_transformer_lens_results(
    name: str, tl_prototype: Any, our_prototype: GPT, request: pytest.FixtureRequest
) -> None:
    """The snippet, run on each model (a fresh copy: snippets add hooks and flip flags), gives
    the same `out` with only the import line changed."""
    tl_model, our_model = tl_prototype, our_prototype
    if name in UNPROCESSED:
        tl_model, our_model = request.getfixturevalue("tl_unprocessed"), request.getfixturevalue("our_unprocessed")
    given = {}
    if name in TOY_WEIGHTS:
        given["pretrained_weights"] = request.getfixturevalue("toy_weights")
        tl_model = our_model = None
    if name in OWN_MODEL:
        given["tokenizer_folder"] = str(request.getfixturevalue("checkpoint")["folder"] / "tokenizer")
        tl_model = our_model = None
    theirs = run_snippet(import_lines(name, ours=False), name, copy.deepcopy(tl_model), **copy.deepcopy(given))
    ours = run_snippet(import_lines(name, ours=True), name, copy.deepcopy(our_model), **copy.deepcopy(given))
    problems = differences(ours, theirs)
    assert not problems, f"snippet {name}: " + "\n".join(problems[:20])


def test_snippets_name_neither_library() -> None:
    """Only the import line differs between the two runs: no snippet names either package."""
    for name, source in SNIPPETS.items():
        assert "transformer_lens" not in source and "interp_gpt" not in source, name
        assert "out = " in source or "out=" in source, name


def test_the_extra_imports_bind_the_same_names_from_the_other_package() -> None:
    """Each extra import line changes only where the names come from, not what the snippet calls them."""

    def bound(line: str) -> list[str]:
        return [part.split(" as ")[-1].strip() for part in line.split(" import ", 1)[1].split(",")]

    for name, (theirs, ours) in [("every snippet", (TL_IMPORT, OUR_IMPORT)), *EXTRA_IMPORTS.items()]:
        assert theirs.startswith("from transformer_lens") and ours.startswith("from interp_gpt"), name
        assert bound(theirs) == bound(ours), name
    assert set(EXTRA_IMPORTS) | UNPROCESSED | TOY_WEIGHTS | OWN_MODEL | set(KNOWN_DIFFERENCES) <= set(SNIPPETS)


def test_the_comparison_catches_a_changed_weight(our_prototype: GPT) -> None:
    """`differences` sees a weight changed by 1e-2 in one head (through the cache, the circuits and
    the composition scores), and nothing between two runs of one model."""
    names = ["main_demo_run_with_cache", "arena_all_heads_ov_qk_and_copying_scores", "arena_composition_scores"]
    changed = copy.deepcopy(our_prototype)
    with torch.no_grad():
        changed.blocks[0].attn.W_V[1] += 1e-2 * torch.randn(changed.blocks[0].attn.W_V[1].shape)
        changed.blocks[0].attn.W_O[1] += 1e-2 * torch.randn(changed.blocks[0].attn.W_O[1].shape)
    for name in names:
        same = run_snippet(import_lines(name, ours=True), name, copy.deepcopy(our_prototype))
        assert differences(run_snippet(import_lines(name, ours=True), name, copy.deepcopy(our_prototype)), same) == []
        assert differences(run_snippet(import_lines(name, ours=True), name, changed), same), name


def test_the_comparison_checks_types_shapes_and_keys() -> None:
    t = torch.arange(6.0).reshape(2, 3)
    assert differences({"a": t, "b": [1, "x"]}, {"a": t.clone(), "b": [1, "x"]}) == []
    assert differences(t + 1e-6, t) == []
    assert differences(t + 1e-3, t) and differences(t.T, t) and differences(t.long(), t)
    assert differences({"a": t}, {"a": t, "b": t}) and differences([1, 2], (1, 2)) and differences("a", "b")
    assert differences(1.0, 1.0 + 1e-6) == [] and differences(1.0, 1.01) and differences(2, 3)
    assert differences(True, 1) and differences(FactoredMatrix(t, t.T), t)
