"""Train the small GPT-2 that ships inside the package.

Reproducible: everything random comes from --seed, and the thread count is fixed
(--threads), since it changes the order of float reductions. The result is saved as
a Hugging Face GPT-2 folder (config.json + model.safetensors) plus its tokenizer, so
interp_gpt, transformer-lens and transformers all load it like any GPT-2 checkpoint.

    python scripts/train_small_model.py                    # the shipped model
    python scripts/train_small_model.py --max-steps 20 --out /tmp/try   # a quick look

The corpora ship in the repo, in data/corpus; they are checked against data/SHA256SUMS
before anything is trained, so a run never starts on the wrong bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import torch

from interp_gpt import GPT, Config, save_hf_checkpoint
from interp_gpt.files import write_atomic
from interp_gpt.inspect import head_scores
from interp_gpt.model import lm_cross_entropy_loss
from interp_gpt.tokenizer import train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / "data" / "corpus"
SHA256SUMS = REPO / "data" / "SHA256SUMS"
NAME = "tiny-gpt2"
DEFAULT_OUT = REPO / "interp_gpt" / "weights" / NAME
CORPORA = ("tinyshakespeare_input.txt", "warpeace_input.txt")


def expected_sha256(sums: Path = SHA256SUMS) -> dict[str, str]:
    """File name -> sha256 from a `sha256sum` list (paths in it are relative to data/)."""
    if not sums.is_file():
        raise FileNotFoundError(f"{sums} not found: it lists the sha256 of the corpora (see data/README.md)")
    expected = {}
    for number, line in enumerate(sums.read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split(maxsplit=1)
        if len(parts) == 2:
            expected[Path(parts[1].lstrip("*")).name] = parts[0].lower()
        elif parts:
            raise ValueError(f"{sums} line {number} is not 'SHA256  PATH': {line!r}")
    return expected


def check_corpus(data_dir: Path, sums: Path = SHA256SUMS) -> None:
    """Every corpus file is in `data_dir` with the sha256 that `sums` lists, or a clear error."""
    expected = expected_sha256(sums)
    for name in CORPORA:
        path = data_dir / name
        if name not in expected:
            raise ValueError(f"{sums} lists no sha256 for {name}")
        if not path.is_file():
            raise FileNotFoundError(f"--data: corpus file {path} not found (the repo ships it in data/corpus)")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected[name]:
            raise ValueError(
                f"--data: corpus file {path} has sha256 {digest}, but {sums} expects {expected[name]}: "
                "it is not the file the shipped model was trained on (see data/README.md)"
            )


def load_corpus(data_dir: Path) -> list[str]:
    """The corpora as text, after `check_corpus`: War and Peace loses its byte-order mark and CRLF line ends."""
    check_corpus(data_dir)
    return [(data_dir / name).read_text(encoding="utf-8").lstrip("\ufeff").replace("\r\n", "\n") for name in CORPORA]


def split(ids: torch.Tensor, frac: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    cut = int(len(ids) * frac)
    return ids[:cut], ids[cut:]


def batch(
    data: list[torch.Tensor],
    batch_size: int,
    n_ctx: int,
    gen: torch.Generator,
    bos: int,
    random_frac: float = 0.0,
    passage_frac: float = 0.0,
) -> torch.Tensor:
    """`batch_size` rows of `n_ctx` tokens: end-of-text (GPT-2's BOS), then a random window
    of text, from each corpus in proportion to its size.

    Some rows repeat something, so that in-context copying pays off within a short CPU run
    (natural text repeats itself too, names and refrains, but too rarely inside one short
    window for a 2-layer model to learn copying in a few thousand steps). For a body of
    h tokens (n_ctx/16 <= h <= n_ctx/2):
      * a `random_frac` share are h tokens drawn uniformly from the vocabulary (end-of-text
        excluded), the same h tokens again, then text: the copying task on which induction
        heads form fastest, and the one the induction score measures;
      * a `passage_frac` share read a passage P of h tokens, then P again and read on.
    """
    sizes = torch.tensor([len(d) - n_ctx for d in data], dtype=torch.float64)
    which = torch.multinomial(sizes / sizes.sum(), batch_size, replacement=True, generator=gen)
    kind = torch.rand(batch_size, generator=gen)
    body = n_ctx - 1
    lengths = torch.randint(max(2, n_ctx // 16), body // 2 + 1, (batch_size,), generator=gen)
    rows = []
    for w, k, h in zip(which.tolist(), kind.tolist(), lengths.tolist(), strict=True):
        start = int(torch.randint(0, len(data[w]) - n_ctx, (1,), generator=gen))
        window = data[w][start : start + body].long()
        if k < random_frac:
            seq = torch.randint(0, bos, (h,), generator=gen)  # every id below end-of-text
            window = torch.cat([seq, seq, window])[:body]
        elif k < random_frac + passage_frac:
            window = torch.cat([window[:h], window])[:body]
        rows.append(torch.cat([torch.tensor([bos]), window]))
    return torch.stack(rows)


def parse_stages(text: str) -> list[tuple[int, int]]:
    """ "32:1500,128:1000" -> [(32, 1500), (128, 1000)]: (context length, steps) per stage."""
    try:
        stages = [tuple(int(x) for x in part.split(":")) for part in text.split(",")]
    except ValueError:
        stages = []
    if not stages or any(len(st) != 2 or st[0] < 4 or st[1] < 0 for st in stages):
        raise ValueError(f"--stages: expected 'CTX:STEPS,CTX:STEPS,...' (CTX >= 4), got {text!r}")
    return stages  # type: ignore[return-value]


def tied_logits(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """Logits with the unembedding tied to the embedding (W_U = W_E^T), as GPT-2 trains.

    Tying is what lets a copying circuit work for every token at once: a head that moves
    a token's embedding forward raises that token's own logit, rare tokens included.
    """
    resid = model(tokens, stop_at_layer=model.cfg.n_layers)
    return model.ln_final(resid) @ model.embed.W_E.T


def untie(model: GPT) -> None:
    """Write the tied unembedding into W_U, so the saved model computes what was trained."""
    with torch.no_grad():
        model.unembed.W_U.copy_(model.embed.W_E.T)


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    stages = parse_stages(args.stages)
    n_ctx = max(ctx for ctx, _ in stages)
    total_steps = sum(steps for _, steps in stages)
    texts = load_corpus(Path(args.data))
    print(f"corpus: {', '.join(CORPORA)} in {args.data}, sha256 as in {SHA256SUMS.name}", flush=True)
    # A byte-level BPE learned from the corpora: word-sized tokens, so a repeated name is
    # one repeated token, which is what induction heads look for; any text encodes.
    tok = train_bpe_tokenizer(texts, args.vocab, name=NAME)
    encoded = [torch.tensor(tok.encode(t), dtype=torch.int16) for t in texts]
    train_data, val_data = (list(d) for d in zip(*(split(e) for e in encoded), strict=True))
    eot = tok.eos_token_id

    cfg = Config(
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        d_vocab=tok.vocab_size,
        n_ctx=n_ctx,
        model_name=NAME,
        tokenizer_name=NAME,
    )
    model = GPT(cfg, tokenizer=tok)
    model.init_weights(args.seed)
    # W_U is tied to W_E while training (see tied_logits) and GPT-2 has no unembedding bias.
    model.unembed.W_U.requires_grad_(False)
    model.unembed.b_U.requires_grad_(False)

    # Weight decay on the matrices, not on the embeddings: decay would shrink the rows of
    # rare tokens towards zero, and a head can then no longer tell them apart.
    def decays(name: str) -> bool:
        return name.split(".")[-1].startswith("W_") and name not in ("embed.W_E", "pos_embed.W_pos")

    decay = [p for n, p in model.named_parameters() if p.requires_grad and decays(n)]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not decays(n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)

    def lr_at(step: int) -> float:  # linear warm-up, then cosine decay to 10%
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, total_steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    losses = []
    start = time.time()
    model.train()
    step = 0
    # A curriculum on the context: short windows first. At the start every head attends
    # almost evenly to all earlier positions, so the signal that grows a previous-token
    # head and an induction head on top of it is diluted by the window's length; in short
    # windows it is strong, and the heads then carry over to longer ones. Every stage
    # sees about the same number of tokens per step (more rows when they are short).
    last = total_steps if args.max_steps is None else min(total_steps, args.max_steps)
    for ctx, steps in stages:
        rows = max(1, args.batch * n_ctx // ctx)
        for _ in range(min(steps, last - step)):
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            tokens = batch(train_data, rows, ctx, gen, eot, args.random_frac, args.passage_frac)
            loss = lm_cross_entropy_loss(tied_logits(model, tokens), tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            if args.log_every and (step % args.log_every == 0 or step == last - 1):
                # The best previous-token and induction scores so far, on repeated random
                # tokens that fit this stage's window: the induction head's appearance is
                # a visible jump (no randomness of training is touched).
                scores = head_scores(model, seq_len=min(50, (ctx - 1) // 2), batch_size=4)
                print(
                    f"step {step:5d}  ctx {ctx:4d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  "
                    f"prev-token {scores['previous token'].max():.2f}  induction {scores['induction'].max():.2f}  "
                    f"{time.time() - start:6.0f}s",
                    flush=True,
                )
            step += 1
    seconds = time.time() - start
    untie(model)

    model.eval()
    eval_gen = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        final = {
            name: sum(
                lm_cross_entropy_loss(model(b), b).item()
                for b in (batch(data, args.batch, n_ctx, eval_gen, eot) for _ in range(args.eval_batches))
            )
            / args.eval_batches
            for name, data in (("train", train_data), ("val", val_data))
        }
        scores = head_scores(model)
    summary = {
        "seed": args.seed,
        "stages": args.stages,
        "steps": step,
        "batch": args.batch,
        "lr": args.lr,
        "random_frac": args.random_frac,
        "passage_frac": args.passage_frac,
        "threads": args.threads,
        "train_seconds": round(seconds, 1),
        "train_loss": round(final["train"], 4),
        "val_loss": round(final["val"], 4),
        "best_previous_token_score": round(float(scores["previous token"].max()), 4),
        "best_induction_score": round(float(scores["induction"].max()), 4),
        "config": cfg.to_dict(),
        "losses_first": losses[:5],
    }
    if args.out:
        out = Path(args.out)
        # Every file whole or not at all (interp_gpt.files): weights with their config, the tokenizer
        # with its sidecar, each pair pinned by a sha256 that loading checks.
        save_hf_checkpoint(model, out)
        tok.save(out)
        write_atomic(out / "training.json", json.dumps(summary, indent=2))
        print(f"saved to {out}")
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data", default=str(DEFAULT_DATA), help="folder with the corpora (checked against data/SHA256SUMS)"
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="where to save ('' to save nothing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--stages",
        default="32:1500,64:1000,128:1500",
        help="context-length curriculum, CTX:STEPS,... (the last CTX is the model's n_ctx)",
    )
    p.add_argument(
        "--max-steps",
        dest="max_steps",
        type=int,
        default=None,
        help="stop after this many steps in all (a quick look; the schedule is the stages')",
    )
    p.add_argument("--batch", type=int, default=32, help="rows per step at the full context (more when shorter)")
    p.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size, <|endoftext|> included")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", dest="d_model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument(
        "--random-frac",
        dest="random_frac",
        type=float,
        default=0.5,
        help="share of rows that repeat random tokens (see batch())",
    )
    p.add_argument(
        "--passage-frac",
        dest="passage_frac",
        type=float,
        default=0.1,
        help="share of rows that repeat a passage of text (see batch())",
    )
    p.add_argument("--threads", type=int, default=2, help="fixed for reproducibility")
    p.add_argument("--eval-batches", dest="eval_batches", type=int, default=20)
    p.add_argument("--log-every", dest="log_every", type=int, default=250)
    return p


if __name__ == "__main__":
    train(parser().parse_args())
