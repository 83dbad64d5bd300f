#!/usr/bin/env bash
# A new user's first hour, from a wheel: build the wheel from this clone, install it in a fresh venv
# (torch first, then the wheel with the README's extras), then, from an empty folder outside the clone,
# run every command the README documents (small sizes) and every python block of the README.
# Prints one line per step and a summary; exits non-zero when any step fails.
#   bash scripts/first_hour.sh [WORKDIR]      (default: a new temporary folder; ~10 min on 2 cores)
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK/run"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
log="$WORK/first_hour.log"
: >"$log"
failed=()
step() {  # step NAME COMMAND...: run it in $WORK/run, keep its output in the log
    local name="$1"
    shift
    local t0=$SECONDS
    if (cd "$WORK/run" && "$@") >>"$log" 2>&1; then
        echo "ok    $(printf '%4d' $((SECONDS - t0))) s  $name"
    else
        echo "FAIL  $(printf '%4d' $((SECONDS - t0))) s  $name   (see $log)"
        failed+=("$name")
    fi
}

echo "== building the wheel and a fresh venv in $WORK"
python3 -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO" >>"$log" 2>&1 || { echo "wheel build failed"; exit 1; }
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q torch==2.13.0 >>"$log" 2>&1
wheel=$(ls "$WORK"/dist/interp_gpt-*.whl)
"$WORK/venv/bin/pip" install -q "$wheel[compare,vocab]" >>"$log" 2>&1 || { echo "wheel install failed"; exit 1; }
PATH="$WORK/venv/bin:$PATH"
export PATH

# A text file of our own: the package ships no corpus (a clone has data/corpus).
python3 - "$WORK/run/text.txt" <<'EOF'
import sys
lines = ["ROMEO: But soft, what light through yonder window breaks?", "JULIET: O Romeo, Romeo, wherefore art thou Romeo?"]
open(sys.argv[1], "w").write("\n".join(lines * 400) + "\n")
EOF

# Two README blocks read the clone's data/corpus and say so: a folder of our own text stands in.
mkdir -p "$WORK/run/data/corpus" && cp "$WORK/run/text.txt" "$WORK/run/data/corpus/"

echo "== the documented commands, from $WORK/run"
step "interp-gpt --version" interp-gpt --version
step "interp-gpt compare" interp-gpt compare
step "interp-gpt generate" interp-gpt generate "ROMEO:" --greedy
step "interp-gpt attention" interp-gpt attention "When Mary and John went to the store, John gave" --layer 1 --head 2 --out page.html
step "interp-gpt lens" interp-gpt lens "When Mary and John went to the store, John gave"
step "interp-gpt heads" interp-gpt heads
step "interp-gpt features" interp-gpt features tiny-gpt2 tiny-gpt2-sae --feature 3 --data text.txt
step "interp-gpt harvest" interp-gpt harvest --hook blocks.1.hook_resid_pre --data text.txt --out acts-cli --n-tokens 4096 --no-progress
step "interp-gpt train-sae" interp-gpt train-sae --hook blocks.1.hook_resid_pre --data text.txt --out sae --d-sae 128 --k 8 --n-tokens 8192 --batch-size 512 --no-progress
step "interp-gpt train-transcoder" interp-gpt train-transcoder --kind skip --data text.txt --out tc --d-sae 128 --k 8 --n-tokens 8192 --batch-size 512 --no-progress
step "interp-gpt train-lens" interp-gpt train-lens --data text.txt --steps 20 --batch-size 4 --context-size 64 --no-progress --out lens-tiny
step "interp-gpt lens --tuned" interp-gpt lens "ROMEO: But soft" --tuned lens-tiny
step "interp-gpt attribute" interp-gpt attribute tiny-gpt2 "The cat sat on the mat because" --transcoders shipped --out graph.html --json graph.json

echo "== the README's python blocks, each alone, against the installed wheel"
python3 - "$REPO/README.md" "$WORK/run" <<'EOF'
import re, sys
from pathlib import Path
text = Path(sys.argv[1]).read_text(encoding="utf-8")
for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.S)):
    (Path(sys.argv[2]) / f"readme_block_{i:02d}.py").write_text(block, encoding="utf-8")
EOF
for f in "$WORK"/run/readme_block_*.py; do
    step "README $(basename "$f")" python "$f"
done

echo "== $(( ${#failed[@]} )) failed"
for f in "${failed[@]}"; do echo "   $f"; done
[ ${#failed[@]} -eq 0 ]
