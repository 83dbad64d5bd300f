"""Write the demo notebooks (demos/*.ipynb) from the cells below.

The notebooks are generated so that they stay reviewable (this file is the source) and
regenerable (cell ids are fixed, outputs are empty):

    python demos/make_notebooks.py

`tests/test_demos.py` executes every notebook top to bottom on the shipped model.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

# The first code cell of every notebook: switching to GPT-2 small is changing this one line.
MODEL_CELL = 'MODEL_NAME = "tiny-gpt2"  # or "gpt2" (needs the Hugging Face hub)'


def md(text: str) -> tuple[str, str]:
    return "markdown", textwrap.dedent(text).strip()


def code(text: str) -> tuple[str, str]:
    return "code", textwrap.dedent(text).strip()


MODEL_INTRO = md(
    """
    The model: `"tiny-gpt2"` ships inside the package (2 layers, 4 heads, d_model 128,
    a 2048-token byte-level BPE, trained on Shakespeare and War and Peace) and loads with
    no network. Set `MODEL_NAME = "gpt2"` to run everything on GPT-2 small instead (it is
    downloaded through the Hugging Face hub and its cache). Nothing below depends on
    which model it is: layers and heads are found from the model's own numbers.
    """
)


# ----------------------------------------------------------------------------
# 01: load and compare
# ----------------------------------------------------------------------------
NB01 = [
    md(
        """
        # 01 · Load a model and check it against transformer-lens and Hugging Face

        `interp_gpt` is a from-scratch GPT-2 with transformer-lens' parameter names, hook
        names and API (`run_with_cache`, `run_with_hooks`, `cache["pattern", 0]`,
        `from_pretrained` with the same weight processing). This notebook

        1. loads a model twice: processed (as `HookedTransformer.from_pretrained` does by
           default) and unprocessed (`from_pretrained_no_processing`);
        2. runs it on a prompt;
        3. runs transformer-lens and Hugging Face `transformers` on the same tokens and
           compares the logits and **every activation both sides expose**, hook by hook;
        4. plots the largest difference of each hook.
        """
    ),
    code(MODEL_CELL),
    MODEL_INTRO,
    code(
        """
        from pathlib import Path

        import plotly.graph_objects as go
        import torch

        from interp_gpt import GPT, compare, to_transformer_lens, to_transformers
        from interp_gpt.loading import shipped_models
        """
    ),
    md(
        """
        ## Load the model, processed and unprocessed

        `GPT.from_pretrained` applies transformer-lens' default processing: `fold_ln`
        (LayerNorm weights folded into the next matrices, leaving `LNPre`),
        `center_writing_weights`, `center_unembed` and `fold_value_biases`; each is a
        keyword flag. `GPT.from_pretrained_no_processing` keeps the weights as stored,
        which is what Hugging Face computes with.
        """
    ),
    code(
        """
        torch.set_grad_enabled(False)  # inference only in this notebook
        model = GPT.from_pretrained(MODEL_NAME)
        raw = GPT.from_pretrained_no_processing(MODEL_NAME)
        print(model.cfg)
        print(model.tokenizer)
        """
    ),
    md(
        """
        ## Run it on a prompt

        Strings go through the model's own tokenizer; `to_tokens` prepends BOS as
        transformer-lens does for GPT-2. The model returns logits `[batch, pos, d_vocab]`,
        or the next-token loss with `return_type="loss"`.
        """
    ),
    code(
        """
        PROMPT = "To be, or not to be, that is the question:"
        tokens = model.to_tokens(PROMPT)
        print(tokens.shape, model.to_str_tokens(PROMPT))

        logits, loss = model(tokens, return_type="both")
        print(f"loss {loss.item():.3f}")
        top = logits[0, -1].softmax(-1).topk(5)
        for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            print(f"  {p:.3f}  {model.to_string([i])!r}")
        """
    ),
    md(
        """
        Greedy continuation with `generate` (`do_sample=False`; it uses a key/value cache,
        and hooks fire at every step).
        """
    ),
    code(
        """
        model.generate(PROMPT, max_new_tokens=20, do_sample=False)
        """
    ),
    md(
        """
        Processing changes the weights but not what the model computes, with one
        caveat: `center_unembed` subtracts each row's mean from the logits, so processed
        and unprocessed logits differ by a constant per position while the **log-probs**
        agree. That is why processed models are compared by log-probs below.
        """
    ),
    code(
        """
        raw_logits = raw(tokens)
        print(f"max |logits(processed) - logits(raw)|       {(logits - raw_logits).abs().max():.2e}")
        print(f"max |log-probs(processed) - log-probs(raw)| "
              f"{(logits.log_softmax(-1) - raw_logits.log_softmax(-1)).abs().max():.2e}")
        """
    ),
    md(
        """
        ## Build the references from the same checkpoint

        `to_transformer_lens(source)` builds a transformer-lens model offline with the
        checkpoint's weights (a `TransformerBridge` in compatibility mode on
        transformer-lens 4, a `HookedTransformer` on 3.x); `processed=False` skips the
        weight processing. `to_transformers(source)` builds a Hugging Face
        `GPT2LMHeadModel`.

        Both also accept a model name (`to_transformer_lens("tiny-gpt2")` works), but then
        the reference is built from *interp_gpt's* reading of the checkpoint. Given a local
        folder, `transformers.GPT2LMHeadModel.from_pretrained` reads the files itself, so
        the references are independent of our loader. `checkpoint_folder` finds that
        folder: inside the package for a shipped model, in the hub cache otherwise.
        """
    ),
    code(
        '''
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
        print(folder)
        tl_model = to_transformer_lens(folder)                     # processed, like `model`
        tl_raw = to_transformer_lens(folder, processed=False)      # unprocessed, like `raw`
        hf_model = to_transformers(folder)                         # always the stored weights
        print(type(tl_model).__name__, type(hf_model).__name__)
        '''
    ),
    md(
        """
        ## Compare, hook by hook

        `compare(ours, reference, input)` runs both models on the same tokens, caches every
        activation, and for each hook name both expose reports the largest absolute and
        relative difference. A hook passes when every element is within
        `atol 1e-5 + rtol 1e-4 * |reference|`; the logits (log-probs for processed
        weights) within `1e-4`. `report.table()` prints it; `report.passed` is the verdict.

        First our processed model against transformer-lens' processed one: every hook,
        including `hook_attn_scores`, `hook_pattern`, `ln*.hook_scale` and the MLP
        activations.
        """
    ),
    code(
        """
        report_tl = compare(model, tl_model, tokens)
        print(report_tl.table())
        report_tl.passed
        """
    ),
    md(
        """
        The unprocessed model against transformer-lens without processing (here the raw
        logits must match too, not just the log-probs), and against Hugging Face. From
        `transformers` we can read the embeddings, the residual stream, the attention and
        MLP outputs and the MLP's pre/post activations; `table(per_layer=False)` gives the
        largest difference per hook family.
        """
    ),
    code(
        """
        report_tl_raw = compare(raw, tl_raw, tokens)
        print(report_tl_raw.table(per_layer=False))
        report_hf = compare(raw, hf_model, tokens)
        print()
        print(report_hf.table(per_layer=False))
        report_tl_raw.passed, report_hf.passed
        """
    ),
    md(
        """
        Hugging Face only has the stored weights, so against the *processed* model only the
        log-probs can be compared (the residual stream itself differs by design:
        `center_writing_weights` removes its mean).
        """
    ),
    code(
        """
        report_hf_processed = compare(model, hf_model, tokens)
        print(report_hf_processed.table())
        """
    ),
    md(
        """
        With no `input`, `compare` uses a fixed batch of random tokens (2 x 24), which
        exercises the batch axis and tokens the prompt does not contain.
        """
    ),
    code(
        """
        report_random = compare(model, tl_model)
        print(report_random.table(per_layer=False))
        report_random.passed
        """
    ),
    md(
        """
        ## Plot the differences

        One point per hook (and one for the logits or log-probs), per comparison, on a log
        axis. A log axis has no zero: a hook that agrees exactly (e.g. the embeddings,
        read from the same matrix) is drawn at `1e-10`. The dashed line is the absolute
        tolerance; a point above it can still pass through the relative term
        (`rtol * |reference|`), which `report.passed` accounts for.
        """
    ),
    code(
        """
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
            fig.add_trace(go.Scatter(
                x=names, y=[max(v, FLOOR) for v in values], customdata=values, mode="markers", name=label,
                hovertemplate="%{x}<br>max |diff| %{customdata:.3e}<extra></extra>",
            ))
        fig.add_hline(y=report_tl.atol, line_dash="dash", annotation_text=f"atol {report_tl.atol:g}")
        fig.update_layout(
            title=f"{MODEL_NAME}: largest |interp_gpt - reference| per hook",
            xaxis=dict(title="hook", type="category", tickangle=-60),
            yaxis=dict(title="max |difference|", type="log", exponentformat="power"),
            width=1100, height=650, legend=dict(orientation="h", y=1.02, yanchor="bottom"),
        )
        fig
        """
    ),
    md(
        """
        The one-liners do the loading too: `compare_with_transformer_lens(source, input)`
        and `compare_with_huggingface(source, input)`; from a shell,
        `interp-gpt compare <source>` prints the same table.
        """
    ),
    code(
        """
        from interp_gpt import compare_with_huggingface, compare_with_transformer_lens

        print(compare_with_transformer_lens(folder, PROMPT).passed, compare_with_huggingface(folder, PROMPT).passed)
        """
    ),
]


# ----------------------------------------------------------------------------
# 02: attention heads
# ----------------------------------------------------------------------------
NB02 = [
    md(
        """
        # 02 · Find attention heads by what they do

        Three standard head scores, each one number per (layer, head) in [0, 1]:

        - **previous-token**: mean attention from each position to the one just before it;
        - **duplicate-token**: mean attention to earlier copies of the current token;
        - **induction**: mean attention to the token *after* an earlier copy of the current
          token (at `... A B ... A` it attends to `B`).

        As in transformer-lens' induction evals, they are measured on repeated random tokens
        (`BOS A A`), where the only way to predict the second `A` is to copy from the first.
        We then pick the top previous-token head and the top induction head by score, look
        at their patterns on a repeated sequence and on real text, and save an interactive
        viewer of every head as one offline HTML file.
        """
    ),
    code(MODEL_CELL),
    MODEL_INTRO,
    code(
        """
        from pathlib import Path

        import torch

        from interp_gpt import GPT, plots
        from interp_gpt.inspect import head_scores, induction_scores, previous_token_scores, repeated_tokens

        torch.set_grad_enabled(False)
        model = GPT.from_pretrained(MODEL_NAME)
        print(model.cfg.model_name, f"{model.cfg.n_layers} layers x {model.cfg.n_heads} heads")
        """
    ),
    md(
        """
        ## Head scores

        `head_scores(model)` draws 8 random sequences, repeats each (`repeated_tokens`),
        caches only the attention patterns, and returns a dict of `[n_layers, n_heads]`
        tensors. `plots.head_scores_heatmap` draws the dict, one panel per score.
        """
    ),
    code(
        """
        scores = head_scores(model, batch_size=8, seed=0)
        {name: s.shape for name, s in scores.items()}
        """
    ),
    md(
        """
        Drawn as heatmaps, one panel per score (hover for the exact value):
        """
    ),
    code(
        """
        plots.head_scores_heatmap(scores)
        """
    ),
    md(
        """
        ## Pick the heads by score

        `argmax` over the flattened `[n_layers, n_heads]` tensor, turned back into
        (layer, head). `argmax` always returns *some* head: read the score too. A head
        that does the job scores well above the others (an induction head on repeated
        random tokens typically > 0.3); if the top score is close to the rest, the model
        has no such head.
        """
    ),
    code(
        """
        def top_head(score: torch.Tensor) -> tuple[int, int]:
            \"\"\"(layer, head) of the largest entry of a [n_layers, n_heads] score tensor.\"\"\"
            layer, head = divmod(int(score.argmax()), score.shape[1])
            return layer, head


        prev_layer, prev_head = top_head(scores["previous token"])
        ind_layer, ind_head = top_head(scores["induction"])
        print(f"top previous-token head: L{prev_layer}H{prev_head}, "
              f"score {scores['previous token'][prev_layer, prev_head]:.3f} "
              f"(mean over all heads {scores['previous token'].mean():.3f})")
        print(f"top induction head:      L{ind_layer}H{ind_head}, "
              f"score {scores['induction'][ind_layer, ind_head]:.3f} "
              f"(mean over all heads {scores['induction'].mean():.3f})")
        """
    ),
    md(
        """
        ## Their patterns on a repeated random sequence

        One sequence of 15 random tokens, repeated. `run_with_cache` returns logits and an
        `ActivationCache`; `plots.attention_heatmap(cache, str_tokens, layer, head)` draws
        one head (queries down, keys across, the tokens on both axes; spaces show as `␣`).

        A previous-token head is a bright line just below the diagonal. An induction
        head, in the second half, attends one position *after* the earlier copy: a line
        parallel to the diagonal, `seq_len - 1` positions to its left.
        """
    ),
    code(
        """
        rep_tokens = repeated_tokens(model, seq_len=15, batch_size=1, seed=1)  # [1, 1 + 2 * 15]
        rep_str = model.to_str_tokens(rep_tokens[0])
        _, rep_cache = model.run_with_cache(rep_tokens)
        plots.attention_heatmap(rep_cache, rep_str, layer=prev_layer, head=prev_head,
                                title=f"Top previous-token head L{prev_layer}H{prev_head}, repeated random tokens")
        """
    ),
    md(
        """
        And the top induction head on the same tokens: in the second copy, each query
        should attend to the token just after its earlier copy.
        """
    ),
    code(
        """
        plots.attention_heatmap(rep_cache, rep_str, layer=ind_layer, head=ind_head,
                                title=f"Top induction head L{ind_layer}H{ind_head}, repeated random tokens")
        """
    ),
    md(
        """
        ## On real text

        The same heads on text with natural repeats ("and tomorrow", "Tomorrow"). The
        scores can be computed on any cache: `previous_token_scores(cache)` and
        `induction_scores(cache, tokens)` (the latter needs at least one repeated token).
        """
    ),
    code(
        """
        TEXT = (
            "Tomorrow, and tomorrow, and tomorrow,\\n"
            "Creeps in this petty pace from day to day,\\n"
            "To the last syllable of recorded time;\\n"
            "Tomorrow, and tomorrow, and tomorrow."
        )
        text_tokens = model.to_tokens(TEXT)
        text_str = model.to_str_tokens(TEXT)
        _, text_cache = model.run_with_cache(text_tokens)
        print(len(text_str), "tokens")
        print("previous-token scores on the text:\\n", previous_token_scores(text_cache))
        print("induction scores on the text:\\n", induction_scores(text_cache, text_tokens))
        """
    ),
    md(
        """
        The previous-token head on the text: attention one step back, whatever the tokens.
        """
    ),
    code(
        """
        plots.attention_heatmap(text_cache, text_str, layer=prev_layer, head=prev_head,
                                title=f"Previous-token head L{prev_layer}H{prev_head} on text")
        """
    ),
    md(
        """
        The induction head on the text: from the second "Tomorrow, and tomorrow" on, a query
        can attend to what followed its previous occurrence.
        """
    ),
    code(
        """
        plots.attention_heatmap(text_cache, text_str, layer=ind_layer, head=ind_head,
                                title=f"Induction head L{ind_layer}H{ind_head} on text")
        """
    ),
    md(
        """
        Every head of the induction head's layer at once, on one colour scale:
        """
    ),
    code(
        """
        plots.attention_grid(text_cache, text_str, layer=ind_layer)
        """
    ),
    md(
        """
        ## The attention viewer, saved as one offline page

        `plots.attention_viewer` puts every head of every layer in one figure with a layer
        menu and a head menu (plotly's own menus, no extra JavaScript); here it opens on
        the induction head. `plots.save_html` writes it as a single self-contained HTML
        file: plotly.js is inside, and a Content-Security-Policy forbids any request, so
        it opens offline and can be mailed around.

        The file goes into the **current working directory** (the directory the notebook's
        kernel runs in); the cell prints its full path.
        """
    ),
    code(
        """
        viewer = plots.attention_viewer(text_cache, text_str, layer=ind_layer, head=ind_head)
        path = plots.save_html(viewer, Path.cwd() / "attention_viewer.html")
        print(f"saved {path.resolve()} ({path.stat().st_size / 1e6:.1f} MB)")
        viewer
        """
    ),
]


# ----------------------------------------------------------------------------
# 03: cache and patch
# ----------------------------------------------------------------------------
NB03 = [
    md(
        """
        # 03 · Caches, hooks, activation patching and attribution patching

        The transformer-lens workflow, on a task every model with an induction head can do:
        predicting the second copy of a repeated random sequence.

        1. `run_with_cache` and the `ActivationCache`;
        2. the task, and which components write the answer (direct logit attribution);
        3. ablating heads with `run_with_hooks` (zeroing `hook_z`);
        4. activation patching sweeps (`patching.get_act_patch_*`, as in
           `transformer_lens.patching`, batched);
        5. attribution patching, and how well it agrees with real patching.
        """
    ),
    code(MODEL_CELL),
    MODEL_INTRO,
    code(
        """
        from functools import partial

        import plotly.graph_objects as go
        import torch

        from interp_gpt import GPT, get_act_name, patching, plots
        from interp_gpt.inspect import head_scores, repeated_tokens
        from interp_gpt.metrics import logits_to_ave_logit_diff, normalized_logit_diff

        torch.set_grad_enabled(False)  # attribution_patch turns gradients on for itself
        model = GPT.from_pretrained(MODEL_NAME)
        n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
        """
    ),
    md(
        """
        ## 1 · `run_with_cache` and the cache

        `run_with_cache` returns the logits and an `ActivationCache` keyed by
        transformer-lens' hook names. It takes the same short keys: `cache["pattern", 0]`
        is `cache["blocks.0.attn.hook_pattern"]`, `cache["resid_pre", 1]`, `cache["z", 1]`,
        `cache["scale", 0, "ln1"]`.
        """
    ),
    code(
        """
        PROMPT = "Well, Prince, so Genoa and Lucca are now just family estates of the Buonapartes."
        logits, cache = model.run_with_cache(PROMPT)
        print(len(cache), "cached activations, e.g.", list(cache.keys())[:6])
        print("pattern, layer 0:   ", tuple(cache["pattern", 0].shape), "[batch, head, query_pos, key_pos]")
        print("same tensor:        ", cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"])
        print("z, layer 1:         ", tuple(cache["z", 1].shape), "[batch, pos, head, d_head]")
        print("resid_pre, layer 1: ", tuple(cache["resid_pre", 1].shape), "[batch, pos, d_model]")
        print("ln1 scale, layer 0: ", tuple(cache["scale", 0, "ln1"].shape))
        """
    ),
    md(
        """
        Each pattern row sums to 1 over the keys, and is 0 above the diagonal (causal
        mask). The cache also decomposes the residual stream, with transformer-lens' method
        names: `decompose_resid` splits it into what wrote it, and the pieces add up to it.
        """
    ),
    code(
        """
        pattern = cache["pattern", 0]
        print("rows sum to 1:", torch.allclose(pattern.sum(-1), torch.ones_like(pattern[..., 0])))
        print("causal:       ", bool((pattern.triu(1) == 0).all()))

        parts, labels = cache.decompose_resid(layer=n_layers, return_labels=True)
        print(labels)
        print("sum of parts == final residual:",
              torch.allclose(parts.sum(0), cache["resid_post", n_layers - 1], atol=1e-4))
        """
    ),
    md(
        """
        `names_filter` caches only what you ask for (a name, a list, or a function of the
        name), and with `return_type=None` the forward pass stops after the last layer it
        needs.
        """
    ),
    code(
        """
        _, small_cache = model.run_with_cache(PROMPT, names_filter=lambda name: name.endswith("hook_pattern"),
                                              return_type=None)
        list(small_cache.keys())
        """
    ),
    md(
        """
        ## 2 · The task: repeated random tokens

        - **clean**: `BOS A A[:STOP]`, where `A` is `SEQ_LEN` random tokens. The next token
          is `A[STOP]`, which can only be known by finding the earlier `A[STOP-1]` and
          copying what came after it: an induction head's job.
        - **corrupted**: `BOS A' A[:STOP]`, the first copy replaced by other random tokens
          `A'`. The prompt ends the same way, but there is nothing to copy from.
        - **answers**: `[batch, 2]` as in the IOI convention, column 0 correct (`A[STOP]`),
          column 1 wrong: `A'[STOP]`, the token at the same place in the corrupted first
          half (in the context of the corrupted prompt, not of the clean one).
        - **metric**: the logit difference at the last position, averaged over the batch
          (`metrics.logits_to_ave_logit_diff`), and normalised
          (`metrics.normalized_logit_diff`) so that the corrupted run scores 0 and the clean
          run 1.

        `repeated_tokens` draws the random sequences as transformer-lens' induction evals
        do (seeded).
        """
    ),
    code(
        """
        SEQ_LEN, STOP, N_PROMPTS = 20, 10, 8
        clean_full = repeated_tokens(model, seq_len=SEQ_LEN, batch_size=N_PROMPTS, seed=0)  # BOS A A
        other_full = repeated_tokens(model, seq_len=SEQ_LEN, batch_size=N_PROMPTS, seed=1)  # BOS A' A'
        corrupted_full = clean_full.clone()
        corrupted_full[:, 1 : 1 + SEQ_LEN] = other_full[:, 1 : 1 + SEQ_LEN]  # BOS A' A

        n_pos = 1 + SEQ_LEN + STOP  # the prompts end at the second copy of A[STOP - 1]
        clean_tokens, corrupted_tokens = clean_full[:, :n_pos], corrupted_full[:, :n_pos]
        answers = torch.stack([clean_full[:, n_pos], other_full[:, 1 + STOP]], dim=1)  # [batch, 2]
        # One label per position (the tokens differ from prompt to prompt).
        position_labels = ["BOS"] + [f"A{i}" for i in range(SEQ_LEN)] + [f"A{i}" for i in range(STOP)]
        print(clean_tokens.shape, answers.shape)
        print("clean prompt 0:    ", model.to_str_tokens(clean_tokens[0])[-6:], "->", model.to_str_tokens(answers[0, :1]))
        print("corrupted prompt 0:", model.to_str_tokens(corrupted_tokens[0])[-6:])
        """
    ),
    md(
        """
        Run both: the clean run with a full cache (the patching below reads the clean
        activations from it), the corrupted one for its logits. Then the logit differences,
        and the normalised metric the patching functions will call on each patched run.
        The normalisation divides by (clean - corrupted): if the two are close (a model
        without an induction head), the patching maps below are mostly noise.
        """
    ),
    code(
        """
        clean_logits, clean_cache = model.run_with_cache(clean_tokens)
        corrupted_logits = model(corrupted_tokens)
        clean_ld = logits_to_ave_logit_diff(clean_logits, answers)
        corrupted_ld = logits_to_ave_logit_diff(corrupted_logits, answers)
        print(f"logit difference: clean {clean_ld:.3f}, corrupted {corrupted_ld:.3f}")
        print("per prompt (clean):", logits_to_ave_logit_diff(clean_logits, answers, per_prompt=True))

        metric = normalized_logit_diff(answers, clean_logits, corrupted_logits)
        print(f"normalised metric: clean {metric(clean_logits):.3f}, corrupted {metric(corrupted_logits):.3f}")
        """
    ),
    md(
        """
        The loss tells the same story on the full sequences: on the second copy of `A`
        a model that copies is far better than on the first (random tokens cannot be
        predicted), and no better on the corrupted sequences. `loss_per_token=True` gives
        `[batch, pos - 1]`, entry `i` predicting token `i + 1`.
        """
    ),
    code(
        """
        def halves_loss(tokens: torch.Tensor, fwd_hooks=()) -> tuple[float, float]:
            \"\"\"Mean loss on the first copy of A and on the second (without its first token).\"\"\"
            per_token = model.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=list(fwd_hooks))
            return per_token[:, :SEQ_LEN].mean().item(), per_token[:, SEQ_LEN + 1 :].mean().item()


        print("clean      loss on copy 1 / copy 2: {:.3f} / {:.3f}".format(*halves_loss(clean_full)))
        print("corrupted  loss on copy 1 / copy 2: {:.3f} / {:.3f}".format(*halves_loss(corrupted_full)))
        """
    ),
    md(
        """
        Which components write the answer directly? `plots.dla_bar` shows each head's and
        each MLP's direct contribution to the logit difference at the last position
        (`batch=None`: averaged over the prompts); the bars add up to the logit difference.
        """
    ),
    code(
        """
        plots.dla_bar(clean_cache, answers[:, 0], answers[:, 1], batch=None)
        """
    ),
    md(
        """
        ## 3 · Ablating heads with `run_with_hooks`

        A hook has transformer-lens' signature `fn(activation, hook)` and may return a
        replacement. Zeroing one head's `hook_z` (`[batch, pos, head, d_head]`) removes its
        output. First the top induction head (found by score, as in notebook 02), then
        every head in turn.
        """
    ),
    code(
        """
        def top_head(score: torch.Tensor) -> tuple[int, int]:
            layer, head = divmod(int(score.argmax()), score.shape[1])
            return layer, head


        scores = head_scores(model)
        ind_layer, ind_head = top_head(scores["induction"])
        prev_layer, prev_head = top_head(scores["previous token"])
        print(f"top induction head L{ind_layer}H{ind_head} ({scores['induction'][ind_layer, ind_head]:.2f}), "
              f"top previous-token head L{prev_layer}H{prev_head} ({scores['previous token'][prev_layer, prev_head]:.2f})")


        def zero_head(z: torch.Tensor, hook, head: int) -> torch.Tensor:
            z[:, :, head] = 0.0
            return z


        ablate_induction = [(get_act_name("z", ind_layer), partial(zero_head, head=ind_head))]
        ablated_logits = model.run_with_hooks(clean_tokens, fwd_hooks=ablate_induction)
        print(f"logit difference: clean {clean_ld:.3f}, "
              f"induction head ablated {logits_to_ave_logit_diff(ablated_logits, answers):.3f}")
        print("loss on copy 1 / copy 2, induction head ablated: {:.3f} / {:.3f}".format(*halves_loss(clean_full, ablate_induction)))
        """
    ),
    md(
        """
        A model can have more than one induction head (the shipped tiny-gpt2 has two in
        layer 1, both scoring about 0.86), and then zeroing one leaves the other to do much
        of the copying. Zero every head that scores above 0.5 together:
        """
    ),
    code(
        """
        induction_heads = [(int(layer), int(head)) for layer, head in (scores["induction"] > 0.5).nonzero()]
        ablate_all = [(get_act_name("z", layer), partial(zero_head, head=head)) for layer, head in induction_heads]
        print("induction heads:", [f"L{layer}H{head}" for layer, head in induction_heads])
        print("loss on copy 1 / copy 2, all of them ablated: {:.3f} / {:.3f}".format(*halves_loss(clean_full, ablate_all)))
        """
    ),
    md(
        """
        Every head, one at a time: how much the loss on the second copy rises when it is
        zeroed. The induction circuit needs both a previous-token head (to write "the
        token before me" into each position) and an induction head (to look it up), so
        both should stand out.
        """
    ),
    code(
        """
        base = halves_loss(clean_full)[1]
        loss_increase = torch.zeros(n_layers, n_heads)
        for layer in range(n_layers):
            for head in range(n_heads):
                hooks = [(get_act_name("z", layer), partial(zero_head, head=head))]
                loss_increase[layer, head] = halves_loss(clean_full, hooks)[1] - base
        plots.head_patching_heatmap(loss_increase, title="Zero-ablating one head: loss increase on the second copy",
                                    value_label="loss increase")
        """
    ),
    md(
        """
        ## 4 · Activation patching

        Run the *corrupted* prompt, put back one activation from the *clean* run, and see
        how much of the clean behaviour returns (metric 0 = corrupted, 1 = clean). The
        functions have `transformer_lens.patching`'s names, arguments and result shapes,
        and the metric is called on each patched run's logits exactly as there; they run
        many patched copies in one batched forward.

        `get_act_patch_resid_pre`: the residual stream entering each layer, one position
        at a time, `[n_layers, pos]`. At layer 0 a patch restores one token only. In an
        induction circuit the decisive place is the first copy of `A[STOP]` (the token to
        copy): by the last layer's input its residual also holds, from the previous-token
        head, the token before it, so patching it there restores most of the answer. At
        layer 0, restoring `A[STOP-1]` alone makes the head look at the right place but
        copy the corrupted token there (our "wrong" answer): a negative value.
        """
    ),
    code(
        """
        resid_results = patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric, progress=False)
        print(resid_results.shape)
        plots.patching_heatmap(resid_results, position_labels, title="Patching resid_pre (layer x position)",
                               value_label="normalised logit diff")
        """
    ),
    md(
        """
        `get_act_patch_block_every`: `resid_pre`, `attn_out` and `mlp_out` side by side,
        `[3, n_layers, pos]`.
        """
    ),
    code(
        """
        block_results = patching.get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric, progress=False)
        plots.patching_heatmap(block_results, position_labels, titles=["resid_pre", "attn_out", "mlp_out"],
                               title="Patching each block's pieces", value_label="normalised logit diff")
        """
    ),
    md(
        """
        Per head: `get_act_patch_attn_head_out_all_pos` patches one head's output (`hook_z`)
        at every position, `[n_layers, n_heads]`; `get_act_patch_attn_head_all_pos_every`
        does that for the output, queries, keys, values and pattern, `[5, n_layers, n_heads]`.
        For an induction head the queries (the current token, the same in both runs) should
        matter little. The keys decide *where* it looks and the values *what* it copies, so
        each alone restores only part of the circuit; clean keys with corrupted values
        even copy `A'[STOP]`, the wrong answer (a negative value). Only the output carries both.
        """
    ),
    code(
        """
        head_out = patching.get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, metric, progress=False)
        plots.head_patching_heatmap(head_out, title="Patching each head's output (all positions)",
                                    value_label="normalised logit diff")
        """
    ),
    md(
        """
        The same per head, for each of the head's pieces (output, queries, keys, values,
        pattern), five panels on one colour scale:
        """
    ),
    code(
        """
        every = patching.get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, metric, progress=False)
        plots.head_patching_heatmap(every, titles=["output", "query", "key", "value", "pattern"],
                                    title="Patching each head's pieces (all positions)", value_label="normalised logit diff")
        """
    ),
    md(
        """
        ## 5 · Attribution patching

        Attribution patching estimates *every* patch at once from two forwards and one
        backward: `(clean_act - corrupted_act) * d metric / d act`, summed over the patched
        slice, the gradient taken on the corrupted run. `patching.attribution_patch`
        returns the estimates laid out like the sweeps (`result["resid_pre"]` is
        `[n_layers, pos]`, `result["attn_head_out_all_pos"]` `[n_layers, n_heads]`). Each
        estimates `metric(patched) - metric(corrupted)`; with the normalised metric the
        corrupted run scores 0, so it is directly comparable with the sweeps above. The
        metric must stay differentiable (no `.item()`): `normalized_logit_diff`'s is.
        """
    ),
    code(
        """
        attribution = patching.attribution_patch(model, clean_tokens, corrupted_tokens, metric)
        print(f"clean metric {attribution.clean_metric:.3f}, corrupted metric {attribution.corrupted_metric:.3f}")
        print(attribution.keys())
        plots.patching_heatmap(
            torch.stack([resid_results - attribution.corrupted_metric, attribution["resid_pre"]]), position_labels,
            titles=["activation patching", "attribution patching"], title="resid_pre: real patching vs its linear estimate",
            value_label="change in metric",
        )
        """
    ),
    md(
        """
        And per head (`attn_head_out_all_pos`), next to the real patching of head outputs:
        """
    ),
    code(
        """
        plots.head_patching_heatmap(
            torch.stack([head_out - attribution.corrupted_metric, attribution["attn_head_out_all_pos"]]),
            titles=["activation patching", "attribution patching"], title="Head outputs: real patching vs its linear estimate",
            value_label="change in metric",
        )
        """
    ),
    md(
        """
        How good is the linear estimate? `patching.attribution_vs_activation_patching` runs
        the real sweep (reusing the attribution result) and reports the Pearson correlation
        over all patches and the largest error. The estimate is exact where the metric is
        linear in the activation (e.g. the last layer's `mlp_out`, up to the final
        LayerNorm); through attention and the LayerNorms it is first-order only, and large
        effects (a whole residual stream patched) are where it errs most.
        """
    ),
    code(
        """
        sweeps = ["resid_pre", "attn_out", "mlp_out", "attn_head_out_all_pos"]
        comparisons = {
            sweep: patching.attribution_vs_activation_patching(
                model, clean_tokens, corrupted_tokens, metric, sweep, attribution=attribution)
            for sweep in sweeps
        }
        for sweep, c in comparisons.items():
            print(f"{sweep:<24} correlation {c.correlation:+.3f}   max |error| {c.max_abs_error:.3f}")
        """
    ),
    md(
        """
        One point per patch, real effect across, estimate up; on the dashed line the
        estimate is exact.
        """
    ),
    code(
        """
        fig = go.Figure()
        for sweep, c in comparisons.items():
            fig.add_trace(go.Scatter(x=c.patching.flatten().cpu(), y=c.attribution.flatten().cpu(), mode="markers",
                                     name=f"{sweep} (r = {c.correlation:.2f})", opacity=0.7))
        lo = min(float(min(c.patching.min(), c.attribution.min())) for c in comparisons.values())
        hi = max(float(max(c.patching.max(), c.attribution.max())) for c in comparisons.values())
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(dash="dash", color="gray")))
        fig.update_layout(title="Attribution patching vs activation patching, one point per patch",
                          xaxis_title="activation patching: change in metric",
                          yaxis_title="attribution patching: estimate", width=800, height=600)
        fig
        """
    ),
]


NOTEBOOKS = {
    "01_load_and_compare.ipynb": NB01,
    "02_attention_heads.ipynb": NB02,
    "03_cache_and_patch.ipynb": NB03,
}


def build(cells: list[tuple[str, str]], stem: str) -> nbformat.NotebookNode:
    """A notebook with no outputs and fixed cell ids (so regenerating gives the same file)."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, source) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "markdown" else new_code_cell(source)
        cell["id"] = f"{stem[:2]}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        path = HERE / name
        nbformat.write(build(cells, path.stem), path)
        print(f"wrote {path.relative_to(HERE.parent)} ({len(cells)} cells)")


if __name__ == "__main__":
    main()
