"""The Jacobian lens fit: our `interp_gpt.lenses.jacobian_lens` against transformer-lens 4.3's
`JacobianLens.fit`, time and agreement, in one run.

    python bench/jacobian_lens.py [--prompts 4] [--tokens 64] [--skip 16] [--dim-batch 16]
                                  [--tl-dim-batch 8] [--threads 1] [--json out.json]

The model is a GPT-2-small-shaped random checkpoint (`_common.checkpoint`: 12 layers, d_model 768), raw
for both (the reference fits on a freshly booted `TransformerBridge`, no weight processing; ours is
`from_pretrained_no_processing`). The prompts are `prompts` rows of `tokens` random token ids, written as
words of a word-level tokenizer ("t123" is id 123) so that the reference's `model.to_tokens(prompt)` gives
exactly those ids after its BOS (50256); ours gets the same ids as tensors. Both fit every layer but the
last with `skip_first_positions=skip`; each library runs its own default `dim_batch` (theirs 8; ours 16)
unless told otherwise. One call each (ours first), `threads` torch threads, in one process: the ratio is
our time over theirs. Run it alone: two torch processes at once slow each other down ~5x on a 2-core
machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
import _common as C  # noqa: E402


def bridge(folder: Path) -> Any:
    """transformer-lens 4.3's raw TransformerBridge of the checkpoint, with the word-level tokenizer."""
    import tokenizers
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    n = hf.config.vocab_size
    vocab = {f"t{i}": i for i in range(n - 1)} | {"<|endoftext|>": n - 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        add_bos_token=True,
    )
    tok.init_kwargs["name_or_path"] = "interp_gpt-bench-jlens"
    return TransformerBridge.boot_transformers(
        "interp_gpt-bench-jlens", hf_model=copy.deepcopy(hf), tokenizer=tok, device="cpu"
    ).eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="token ids per prompt, BOS not counted")
    p.add_argument("--skip", type=int, default=16, help="skip_first_positions")
    p.add_argument("--dim-batch", type=int, default=16, help="ours (its default: 16)")
    p.add_argument("--tl-dim-batch", type=int, default=8, help="transformer-lens' (its default: 8)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    from transformer_lens.tools.analysis import JacobianLens

    from interp_gpt import from_pretrained_no_processing
    from interp_gpt.lenses import jacobian_lens

    folder, made_by = C.checkpoint(seed=args.seed)
    ref = bridge(folder)
    ours = from_pretrained_no_processing(str(folder), tokenizer=None).eval()
    ids = C.random_tokens(args.prompts, args.tokens, seed=args.seed)
    prompts = [" ".join(f"t{int(i)}" for i in row) for row in ids]
    rows = [ref.to_tokens(prompt)[0] for prompt in prompts]
    assert all(int(r[0]) == 50256 and torch.equal(r[1:], i) for r, i in zip(rows, ids, strict=True)), (
        "the tokenizer changed ids"
    )

    start = time.perf_counter()
    lens = jacobian_lens(ours, rows, skip_first_positions=args.skip, dim_batch=args.dim_batch)
    ours_s = time.perf_counter() - start
    print(f"ours: {ours_s:.1f} s", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        theirs = JacobianLens.fit(
            ref,
            prompts,
            corpus="bench",
            dim_batch=args.tl_dim_batch,
            skip_first_positions=args.skip,
            show_progress=False,
        )
        theirs_s = time.perf_counter() - start
    print(f"transformer-lens: {theirs_s:.1f} s", flush=True)
    want = torch.stack([theirs.jacobians[layer] for layer in lens.source_layers])
    results = {
        "machine": os.uname().nodename,
        "threads": args.threads,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "checkpoint": made_by,
        "prompts": args.prompts,
        "tokens_per_prompt_with_bos": args.tokens + 1,
        "skip_first_positions": args.skip,
        "dim_batch": {"ours": args.dim_batch, "transformer_lens": args.tl_dim_batch},
        "seconds": {"ours": ours_s, "transformer_lens": theirs_s},
        "time_ratio": ours_s / theirs_s,
        "J_max_abs_diff": float((lens.J - want).abs().max()),
        "J_max_abs": float(want.abs().max()),
        "torch": torch.__version__,
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
