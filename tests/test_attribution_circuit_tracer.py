"""Attribution graphs equal to circuit-tracer 0.5.0's `attribute` on a random GPT-2's raw weights, with
random transcoders of every kind it supports: per-layer (ReLU, JumpReLU, TopK; with and without skip)
and cross-layer (ReLU, JumpReLU; with and without skip).

Its replacement model is built offline as tests/test_transcoder_circuit_tracer.py builds it (a
HookedTransformerConfig and the Hugging Face weights), ours is `GPT.from_pretrained_no_processing` on the
same checkpoint, and our transcoders are built from its tensors. Compared: input_tokens, the logit targets
and their probabilities, active_features, activation_values, selected_features, and adjacency_matrix to
1e-4 relative to its scale (two implementations of a float32 forward and backward pass).
Run in circuit-tracer's own venv (.venv-ct, see .ci/run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("circuit_tracer", reason="circuit-tracer 0.5 needs its own venv (.venv-ct, see .ci/run)")
from circuit_tracer.attribution.attribute import attribute as ct_attribute  # noqa: E402
from circuit_tracer.transcoder.activation_functions import JumpReLU, TopK  # noqa: E402
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder as CTCrossLayerTranscoder  # noqa: E402
from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet  # noqa: E402
from test_transcoder_circuit_tracer import clt_from, ours_from, their_replacement_model  # noqa: E402

from interp_gpt import GPT  # noqa: E402
from interp_gpt.attribution import attribute  # noqa: E402

CPU = torch.device("cpu")
IN_HOOK, OUT_HOOK = "ln2.hook_normalized", "hook_mlp_out"
F_SAE, K = 48, 6
# starts with token 0, the checkpoint's BOS (a special token for both: neither prepends another)
TOKENS = torch.tensor([0, 17, 42, 9, 88, 5, 61, 23, 7, 3])


class _Tokenizer:
    """What circuit-tracer asks of a tokenizer for token-id prompts (the checkpoint has none)."""

    all_special_ids = [0]
    bos_token_id = pad_token_id = eos_token_id = 0
    vocab_size = 100
    padding_side = "right"

    def decode(self, ids: object) -> str:
        return str(ids.tolist() if isinstance(ids, torch.Tensor) else ids)


def our_model(hf_checkpoint_dir: Path) -> GPT:
    """Ours on the same checkpoint, with the same tokenizer stub: token 0 is its BOS for both (without a
    tokenizer ours would take position 0 as the prompt's first token and keep its features)."""
    model = GPT.from_pretrained_no_processing(str(hf_checkpoint_dir))
    model.tokenizer = _Tokenizer()
    return model


def their_model(hf_model, transcoders):  # type: ignore[no-untyped-def]
    model = their_replacement_model(hf_model, transcoders)
    model.tokenizer = _Tokenizer()
    return model


def plts(kind: str, skip: bool, d: int, n: int, seed: int) -> tuple[TranscoderSet, list]:
    g = torch.Generator().manual_seed(seed)
    theirs, mine = {}, []
    for layer in range(n):
        act = {"relu": torch.nn.functional.relu, "jumprelu": None, "topk": TopK(K)}[kind]
        if kind == "jumprelu":
            act = JumpReLU(torch.randn(F_SAE, generator=g) * 0.5, 0.1)
        t = SingleLayerTranscoder(d, F_SAE, act, layer, skip_connection=skip, device=CPU, dtype=torch.float32)
        with torch.no_grad():
            for name in ("W_enc", "W_dec", "b_enc", "b_dec", "W_skip"):
                p = getattr(t, name)
                if p is not None:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        theirs[layer] = t
        mine.append(ours_from(t, kind, K, layer=layer))
    return TranscoderSet(theirs, feature_input_hook=IN_HOOK, feature_output_hook=OUT_HOOK, scan="test"), mine


def clt(kind: str, skip: bool, d: int, n: int, seed: int) -> tuple[CTCrossLayerTranscoder, object]:
    theirs = CTCrossLayerTranscoder(
        n, F_SAE, d, activation_function="jump_relu" if kind == "jumprelu" else "relu", skip_connection=skip,
        lazy_decoder=False, lazy_encoder=False, feature_input_hook=IN_HOOK, feature_output_hook=OUT_HOOK,
        device=CPU, dtype=torch.float32,
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "threshold" in name else 0.2))
    return theirs, clt_from(theirs, kind)


def assert_graphs_equal(mine, ref, rel: float = 1e-4) -> dict[str, float]:  # type: ignore[no-untyped-def]
    assert torch.equal(mine.input_tokens.cpu(), ref.input_tokens.cpu())
    assert [t.vocab_idx for t in mine.logit_targets] == [t.vocab_idx for t in ref.logit_targets]
    torch.testing.assert_close(mine.logit_probabilities, ref.logit_probabilities.float(), rtol=1e-5, atol=1e-5)
    assert torch.equal(mine.active_features, ref.active_features)
    torch.testing.assert_close(mine.activation_values, ref.activation_values.float(), rtol=1e-5, atol=1e-5)
    assert torch.equal(mine.selected_features, ref.selected_features)
    a, b = mine.adjacency_matrix, ref.adjacency_matrix
    assert a.shape == b.shape
    scale = float(b.abs().max())
    assert scale > 0 and bool((b != 0).any())
    diff = float((a - b).abs().max())
    assert diff <= rel * scale, f"adjacency differs by {diff} (scale {scale})"
    return {"max_abs": diff, "max_rel": diff / scale}


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("kind", ["relu", "jumprelu", "topk"])
def test_plt_graph_equals_circuit_tracers(hf_model, hf_checkpoint_dir: Path, kind: str, skip: bool) -> None:  # type: ignore[no-untyped-def]
    n, d = hf_model.config.n_layer, hf_model.config.n_embd
    tset, mine = plts(kind, skip, d, n, seed=3)
    ref = ct_attribute(TOKENS, their_model(hf_model, tset), batch_size=16)
    model = our_model(hf_checkpoint_dir)
    graph = attribute(model, TOKENS, mine, batch_size=16)
    assert graph.n_features > 20
    print(kind, skip, assert_graphs_equal(graph, ref))


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("kind", ["relu", "jumprelu"])
def test_clt_graph_equals_circuit_tracers(hf_model, hf_checkpoint_dir: Path, kind: str, skip: bool) -> None:  # type: ignore[no-untyped-def]
    n, d = hf_model.config.n_layer, hf_model.config.n_embd
    theirs, mine = clt(kind, skip, d, n, seed=4)
    ref = ct_attribute(TOKENS, their_model(hf_model, theirs), batch_size=16)
    model = our_model(hf_checkpoint_dir)
    graph = attribute(model, TOKENS, mine, batch_size=16)
    assert graph.n_features > 20
    print("clt", kind, skip, assert_graphs_equal(graph, ref))


def test_feature_selection_and_targets_equal_circuit_tracers(hf_model, hf_checkpoint_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """max_feature_nodes (features visited by influence), token-id targets and custom directions."""
    n, d = hf_model.config.n_layer, hf_model.config.n_embd
    tset, mine = plts("jumprelu", True, d, n, seed=5)
    theirs = their_model(hf_model, tset)
    model = our_model(hf_checkpoint_dir)
    ref = ct_attribute(TOKENS, theirs, max_feature_nodes=30, batch_size=8, update_interval=2)
    graph = attribute(model, TOKENS, mine, max_feature_nodes=30, batch_size=8, update_interval=2)
    assert graph.n_features == 30 < graph.active_features.shape[0]
    print("selection", assert_graphs_equal(graph, ref))
    ids = torch.tensor([5, 42, 99])
    print("ids", assert_graphs_equal(attribute(model, TOKENS, mine, attribution_targets=ids),
                                     ct_attribute(TOKENS, theirs, attribution_targets=ids)))  # fmt: skip
    g = torch.Generator().manual_seed(9)
    custom = [("a-b", 0.7, torch.randn(d, generator=g)), ("c", 0.3, torch.randn(d, generator=g))]
    mine_c = attribute(model, TOKENS, mine, attribution_targets=custom)
    ref_c = ct_attribute(TOKENS, theirs, attribution_targets=custom)
    assert [t.token_str for t in mine_c.logit_targets] == ["a-b", "c"]
    print("custom", assert_graphs_equal(mine_c, ref_c))
