"""Train the small GPT-2 that ships inside the package.

Reproducible: everything random comes from --seed, and the thread count is fixed
(--threads), since it changes the order of float reductions. The result is saved as
a Hugging Face GPT-2 folder (config.json + model.safetensors) plus its tokenizer, so
interp_gpt, transformer-lens and transformers all load it like any GPT-2 checkpoint.

    python scripts/train_small_model.py                    # the shipped model
    python scripts/train_small_model.py --steps 20 --out /tmp/try   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from interp_gpt import GPT, Config, save_hf_checkpoint
from interp_gpt.inspect import head_scores
from interp_gpt.model import lm_cross_entropy_loss
from interp_gpt.tokenizer import train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "corpus"
NAME = "tiny-gpt2"
DEFAULT_OUT = REPO / "interp_gpt" / "weights" / NAME
CORPORA = ("tinyshakespeare_input.txt", "warpeace_input.txt")


def load_corpus(data_dir: Path) -> list[str]:
    """The corpora as text: War and Peace loses its byte-order mark and CRLF line ends."""
    texts = []
    for name in CORPORA:
        path = data_dir / name
        if not path.exists():
            raise FileNotFoundError(f"--data: {path} not found (the shared data folder holds the corpora)")
        texts.append(path.read_text(encoding="utf-8").lstrip("\ufeff").replace("\r\n", "\n"))
    return texts


def split(ids: torch.Tensor, frac: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    cut = int(len(ids) * frac)
    return ids[:cut], ids[cut:]


def batch(
    data: list[torch.Tensor], batch_size: int, n_ctx: int, gen: torch.Generator,
    repeat_frac: float = 0.0, vocab: int | None = None,
) -> torch.Tensor:
    """Random windows of n_ctx tokens, from each corpus in proportion to its size.

    A `repeat_frac` share of the rows repeat something, so that in-context copying pays off
    within a short CPU run (it is what grows a previous-token head and an induction head;
    natural text repeats itself too, names and refrains, but too rarely inside one window
    for a 2-layer model to learn copying in a few thousand steps):
      * half of them read a passage P of h tokens (n_ctx/8 <= h <= n_ctx/2), then start P
        again and read on: "P continuation" becomes "P P continuation";
      * the other half are h tokens drawn uniformly from the vocabulary (`vocab`, the
        end-of-text id excluded), then the same h tokens again, then the window's text:
        the copying task on which induction heads are known to form fastest.
    """
    sizes = torch.tensor([len(d) - n_ctx for d in data], dtype=torch.float64)
    which = torch.multinomial(sizes / sizes.sum(), batch_size, replacement=True, generator=gen)
    kind = torch.rand(batch_size, generator=gen)  # < repeat_frac/2: passage; < repeat_frac: random
    lengths = torch.randint(n_ctx // 8, n_ctx // 2 + 1, (batch_size,), generator=gen)
    rows = []
    for w, k, h in zip(which.tolist(), kind.tolist(), lengths.tolist(), strict=True):
        start = int(torch.randint(0, len(data[w]) - n_ctx, (1,), generator=gen))
        window = data[w][start : start + n_ctx]
        if k < repeat_frac / 2:
            window = torch.cat([window[:h], window[: n_ctx - h]])
        elif k < repeat_frac:
            if vocab is None:
                raise ValueError("batch: random-token repeats need vocab=")
            seq = torch.randint(0, vocab - 1, (h,), generator=gen).to(window.dtype)
            window = torch.cat([seq, seq, window[: n_ctx - 2 * h]])
        rows.append(window)
    return torch.stack(rows).long()


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    texts = load_corpus(Path(args.data))
    # A byte-level BPE learned from the corpora: word-sized tokens, so a repeated name is
    # one repeated token, which is what induction heads look for; any text encodes.
    tok = train_bpe_tokenizer(texts, args.vocab, name=NAME)
    encoded = [torch.tensor(tok.encode(t), dtype=torch.int16) for t in texts]
    train_data, val_data = zip(*(split(e) for e in encoded), strict=True)

    cfg = Config(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads, d_vocab=tok.vocab_size,
                 n_ctx=args.ctx, model_name=NAME, tokenizer_name=NAME)
    model = GPT(cfg, tokenizer=tok)
    model.init_weights(args.seed)
    # GPT-2 has no unembedding bias (Hugging Face's lm_head has none): keep b_U at zero.
    model.unembed.b_U.requires_grad_(False)
    # Weight decay on the matrices, not on the embeddings: decay would shrink the rows of
    # rare tokens towards zero, and a head can then no longer tell them apart.
    def decays(name: str) -> bool:
        return name.split(".")[-1].startswith("W_") and name not in ("embed.W_E", "pos_embed.W_pos")

    decay = [p for n, p in model.named_parameters() if p.requires_grad and decays(n)]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not decays(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)

    def lr_at(step: int) -> float:  # linear warm-up, then cosine decay to 10%
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    losses = []
    start = time.time()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        tokens = batch(list(train_data), args.batch, args.ctx, gen, args.repeat_frac, tok.vocab_size)
        loss = lm_cross_entropy_loss(model(tokens), tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if args.log_every and (step % args.log_every == 0 or step == args.steps - 1):
            # The best previous-token and induction scores so far: the induction head's
            # appearance is a visible jump (no randomness of training is touched).
            scores = head_scores(model, batch_size=4)
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  "
                  f"prev-token {scores['previous token'].max():.2f}  induction {scores['induction'].max():.2f}  "
                  f"{time.time() - start:6.0f}s", flush=True)
    seconds = time.time() - start

    model.eval()
    eval_gen = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        final = {
            name: sum(lm_cross_entropy_loss(model(b), b).item()
                      for b in (batch(list(data), args.batch, args.ctx, eval_gen) for _ in range(args.eval_batches)))
            / args.eval_batches
            for name, data in (("train", train_data), ("val", val_data))
        }
    summary = {
        "seed": args.seed, "steps": args.steps, "repeat_frac": args.repeat_frac, "batch": args.batch, "threads": args.threads,
        "train_seconds": round(seconds, 1), "train_loss": round(final["train"], 4), "val_loss": round(final["val"], 4),
        "config": cfg.to_dict(), "losses_first": losses[:5],
    }
    if args.out:
        out = Path(args.out)
        save_hf_checkpoint(model, out)
        tok.save(out)
        (out / "training.json").write_text(json.dumps(summary, indent=2))
        print(f"saved to {out}")
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA), help="folder with the corpora")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="where to save ('' to save nothing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size, <|endoftext|> included")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", dest="d_model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--repeat-frac", dest="repeat_frac", type=float, default=0.5,
                   help="share of training rows that repeat a passage (see batch())")
    p.add_argument("--threads", type=int, default=2, help="fixed for reproducibility")
    p.add_argument("--eval-batches", dest="eval_batches", type=int, default=20)
    p.add_argument("--log-every", dest="log_every", type=int, default=100)
    return p


if __name__ == "__main__":
    train(parser().parse_args())
