"""SAE training throughput: interp_gpt's SAETrainer vs sae-lens' LanguageModelSAETrainingRunner, in one run.

    PYTHONPATH=. python bench/sae_training.py [--windows N] [--batch-tokens B] [--repeats R] [--threads T]

Needs sae-lens 6 and transformer-lens 3.9 (its HookedTransformer) in the same environment as interp_gpt.
Both train the same TopK SAE (d_sae 1024, k 32, Adam, lr 2e-3) on tiny-gpt2's blocks.1.hook_resid_pre,
on the same first N 128-token windows of the training text (`split_corpus`'s train part of data/corpus),
with the same batch of B tokens per step and the same mixing buffer (65536 rows, 16 forward passes of
32 windows):
  ours      `SAETrainer.train(activation_batches(model, hook, text, B, keep_in_memory=False), N*128/B)`:
            the activation store tokenizes the text (sae-lens gets the tokens ready-made), runs the model
            with stop_at_layer, mixes, and the trainer steps;
  sae-lens  `LanguageModelSAETrainingRunner(cfg, override_model=<TL 3.9 HookedTransformer with tiny-gpt2's
            weights>, override_dataset=<the token windows>)` with wandb off and no output files, `.run()`.
Each side is timed end to end (building the store or runner included, loading the model not), in
interleaved rounds; the ratio is ours / sae-lens' tokens/s of the medians (the goal: >= 1.5).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOK = "blocks.1.hook_resid_pre"
D_SAE, K, LR = 1024, 32, 2e-3


def prefix_text(model, texts, n_windows):  # type: ignore[no-untyped-def]
    """The shortest prefix of the training text (whole lines) whose windows number at least n_windows (so
    the store reads the same windows sae-lens gets, not a longer text that fills its buffer further)."""
    from interp_gpt.sae.training import token_windows

    text = texts[0]

    def windows(cut: int) -> int:
        return int(token_windows(model, [text[:cut]], 128).shape[0]) if cut > 200 else 0

    ends = [i + 1 for i, c in enumerate(text) if c == "\n"] + [len(text)]
    lo, hi = 0, len(ends) - 1  # bisect for the first line end with enough windows
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if windows(ends[mid]) >= n_windows else (mid + 1, hi)
    cut = ends[lo]
    return text[:cut], token_windows(model, [text[:cut]], 128)[:n_windows]


def ours(model, text: str, n_tokens: int, batch: int, device: str = "cpu") -> float:  # type: ignore[no-untyped-def]
    from interp_gpt.sae import SAE, SAEConfig
    from interp_gpt.sae.training import SAETrainer, SAETrainingConfig, activation_batches

    start = time.perf_counter()
    sae = SAE(SAEConfig(d_in=128, d_sae=D_SAE, architecture="topk", k=K, metadata={"hook_name": HOOK}, device=device))
    trainer = SAETrainer(sae, SAETrainingConfig(lr=LR, log_every=10**9))
    batches = activation_batches(model, HOOK, [text], batch, 128, keep_in_memory=False)
    trainer.train(batches, n_tokens // batch, progress=False)
    return time.perf_counter() - start


def saelens(tl_model, dataset, n_tokens: int, batch: int, device: str = "cpu") -> float:  # type: ignore[no-untyped-def]
    from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

    start = time.perf_counter()
    cfg = LanguageModelSAERunnerConfig(
        sae=TopKTrainingSAEConfig(d_in=128, d_sae=D_SAE, k=K),
        model_name="tiny-gpt2",
        hook_name=HOOK,
        dataset_path="override",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=128,
        prepend_bos=True,
        n_batches_in_buffer=16 * 32,  # its buffer holds n_batches_in_buffer x context_size rows: ours' 65536
        store_batch_size_prompts=32,
        train_batch_size_tokens=batch,
        training_tokens=n_tokens,
        lr=LR,
        device=device,
        dtype="float32",
        logger=LoggingConfig(log_to_wandb=False),
        output_path=None,
        checkpoint_path=None,
        n_checkpoints=0,
        save_final_checkpoint=False,
        verbose=False,
        dead_feature_window=200,
        feature_sampling_window=400,
    )
    LanguageModelSAETrainingRunner(cfg, override_model=tl_model, override_dataset=dataset).run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=512, help="128-token windows of training text (default 512)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the raw times here")
    args = p.parse_args(argv)

    import datasets
    import torch

    from interp_gpt.compare import to_transformer_lens
    from interp_gpt.loading import from_pretrained
    from interp_gpt.sae.training import split_corpus

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    model = from_pretrained("tiny-gpt2").eval()
    tl_model = to_transformer_lens("tiny-gpt2", processed=True)
    train_texts, _ = split_corpus(ROOT / "data" / "corpus")
    text, tokens = prefix_text(model, train_texts, args.windows)
    n_tokens = tokens.numel() // args.batch_tokens * args.batch_tokens
    dataset = datasets.Dataset.from_dict({"tokens": tokens.tolist()})
    from importlib.metadata import version

    print(f"tiny-gpt2 {HOOK}, TopK d_sae={D_SAE} k={K}; {n_tokens} tokens ({tokens.shape[0]} windows of 128), "
          f"batch {args.batch_tokens} tokens, {args.threads} thread(s); sae-lens {version('sae-lens')}, "
          f"transformer-lens {version('transformer-lens')}, torch {torch.__version__}")  # fmt: skip
    times: dict[str, list[float]] = {"ours": [], "sae-lens": []}
    # warm-up (imports, first allocations); sae-lens refuses runs shorter than its mixing buffer
    ours(model, text, n_tokens, args.batch_tokens)
    saelens(tl_model, dataset, n_tokens, args.batch_tokens)
    for r in range(args.repeats):
        times["ours"].append(ours(model, text, n_tokens, args.batch_tokens))
        times["sae-lens"].append(saelens(tl_model, dataset, n_tokens, args.batch_tokens))
        print(f"round {r}: ours {times['ours'][-1]:.2f} s, sae-lens {times['sae-lens'][-1]:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: n_tokens / v for k, v in med.items()}
    ratio = tps["ours"] / tps["sae-lens"]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs (other jobs share the machine: read the ratio)")
    print(f"tokens/s (median): ours {tps['ours']:.0f}, sae-lens {tps['sae-lens']:.0f}; "
          f"ratio {ratio:.2f} ({'PASS' if ratio >= 1.5 else 'MISS'}: goal >= 1.5)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"times": times, "tokens": n_tokens, "ratio": ratio, "load_average": load}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
