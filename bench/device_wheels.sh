#!/usr/bin/env bash
# Fetch, on a machine with network, the wheels that bench/device.sh installs offline on the GPU
# machine so that the transformer-lens and sae-lens rows run there (issue 27, item 6).
#
#   bash bench/device_wheels.sh        # writes .whl/ (ignored by git; about 40 MiB), once
#
# The GPU machine's image already holds torch, transformers, accelerate, pandas, rich,
# sentencepiece, jaxtyping, einops, pyarrow, xxhash, ... (/work/.library/device/KINDS.md); this
# is the rest of what transformer-lens 3.9.0 and sae-lens 6.54.12 need, at the versions of the
# project's bench venv (.venv-tl3: transformers 5.24 / torch 2.13), for CPython 3.12 on x86-64.
# Pure-Python packages published only as source are built into wheels here. The list is the
# closure of the two packages' Requires-Dist in .venv-tl3 minus the image's packages (2026-11).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
mkdir -p .whl
grep -qx '/.whl/' .gitignore || echo "note: .whl/ should be ignored by git (.gitignore has /.whl/)"
wheels=(
    transformer-lens==3.9.0 sae-lens==6.54.12 transformers-stream-generator==0.0.5 beartype==0.23.1
    better-abc==0.0.3 fancy-einsum==0.0.3 typeguard==4.6.1 datasets==5.2.0 dill==0.4.1
    multiprocess==0.70.19 wandb==0.31.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
    typing-inspection==0.4.5 platformdirs==4.14.8
    babe==0.0.7 nltk==3.10.4 plotly==7.1.0 plotly-express==0.4.1 python-dotenv==1.2.4
    simple-parsing==0.1.9 docstring_parser==0.18.0 tenacity==9.2.1 tzdata==2026.6 sniffio==1.3.1
    distro==1.9.0 py2store==0.1.24 config2py==0.1.76 dol==0.3.100 i2==0.1.91 graze==0.1.46
    importlib_resources==7.1.0 cwevals==0.0.1b1 defusedxml==0.7.1 truststore==0.10.5
    opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
    opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-otlp-proto-http==1.45.2
    opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-http-transport==0.66b2
    opentelemetry-exporter-otlp-common==0.66b2 googleapis-common-protos==1.76.0 httpx2==2.16.2
    httpcore2==2.16.2
)
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
for w in "${wheels[@]}"; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "$w" 2> /dev/null \
        || "$py" -m pip wheel -q --no-deps -w .whl "$w" \
        || echo "could not fetch $w"
done
ls .whl | wc -l
du -sh .whl
